"""The models a run trains and their optimizers (``make_learner``), and
its train state, created sharded over the mesh (``init_state``):
parameters from a checkpoint or the seed, QLoRA weights quantized where
they lie, optimizer moments sharded like the parameters."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax import sharding
from starpo_jax.algo.state import CRITIC_OWN, Learner, TrainState, trainable
from starpo_jax.models import checkpoints, lora, transformer
from starpo_jax.models.config import ModelConfig
from starpo_jax.run.assembly.setup import Setup, as_config_error
from starpo_jax.run.sections import OptimConfig


def optimizer(
  lr: float, warmup_steps: int, o: OptimConfig
) -> optax.GradientTransformation:
  """Gradient clipping and AdamW with linear warmup. Always a schedule (a
  constant one without warmup), so every optimizer built here has the same
  state structure and the warm start can hand its state slot to RL."""
  schedule = (
    optax.linear_schedule(0.0, lr, warmup_steps)
    if warmup_steps
    else optax.constant_schedule(lr)
  )
  return optax.chain(
    optax.clip_by_global_norm(o.grad_clip),
    optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
  )


def _model(setup: Setup, value_head: bool) -> ModelConfig:
  """The policy's model, or the critic's: a value head, and the policy's
  adapters where it shares the policy's frozen weights."""
  if not value_head:
    return setup.model_cfg
  shares = setup.config.model.lora.critic == "adapters"
  lora_cfg = setup.model_cfg.lora if shares else None
  return setup.model_cfg.replace(value_head=True, lora=lora_cfg)


def _critic_shares_base(setup: Setup) -> bool:
  return setup.config.algo.uses_critic and _model(setup, True).lora is not None


def _unquantized(cfg: ModelConfig) -> ModelConfig:
  """``cfg`` with its QLoRA weights in floating point (as they load)."""
  if cfg.lora is None or not cfg.lora.quantize:
    return cfg
  return cfg.replace(
    lora=dataclasses.replace(cfg.lora, quantize="", tile_size=0)
  )


def abstract_model(setup: Setup, value_head: bool, unquantized=False):
  """A model's graph definition, abstract parameters and their shardings
  over ``setup.mesh`` (nothing allocated); ``unquantized``: of the model
  with its QLoRA weights in floating point."""
  cfg = _model(setup, value_head)
  cfg = _unquantized(cfg) if unquantized else cfg
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
  graphdef, abstract = nnx.split(model)
  shardings = sharding.state_shardings(
    abstract, setup.mesh, setup.config.logical_axis_rules
  )
  return graphdef, abstract, shardings


def make_learner(setup: Setup) -> Learner:
  """The policy's (and critic's) graph definitions and optimizers."""
  o = setup.config.optim
  critic_def = critic_tx = None
  if setup.config.algo.uses_critic:
    critic_def = abstract_model(setup, True)[0]
    critic_tx = optimizer(o.critic_lr, o.warmup_steps, o)
  return Learner(
    policy_def=abstract_model(setup, False)[0],
    policy_tx=optimizer(o.lr, o.warmup_steps, o),
    critic_def=critic_def,
    critic_tx=critic_tx,
    critic_shares_base=_critic_shares_base(setup),
    adapters=setup.model_cfg.lora is not None,
  )


def sft_optimizer(setup: Setup) -> optax.GradientTransformation:
  s = setup.config.sft
  return optimizer(s.lr, s.warmup_steps, setup.config.optim)


def parameters(setup: Setup, value_head: bool, seed: int):
  """A model's parameters, created (or loaded) already sharded over
  ``setup.mesh`` (no full copy on one device). From a Hugging Face
  checkpoint, its weights and new adapters. A critic that shares the
  policy's weights: its adapters and value head only."""
  m = setup.config.model
  cfg = _model(setup, value_head)
  _, _, shardings = abstract_model(setup, value_head)
  own = value_head and _critic_shares_base(setup)
  loaded = None
  if own:
    shardings = shardings.filter(CRITIC_OWN)
  elif setup.ckpt:
    adapted = cfg.lora is not None
    loads = abstract_model(setup, value_head, unquantized=True)[2]
    with as_config_error():
      model = checkpoints.load(
        setup.ckpt,
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        value_head=value_head,
        shardings=loads.filter(lora.WEIGHTS) if adapted else loads,
      )
    loaded = nnx.split(model)[1]
    if not adapted:
      return loaded
    loaded = quantized(setup, value_head, loaded)
    shardings = shardings.filter(nnx.LoRAParam)
  keep = CRITIC_OWN if own else nnx.LoRAParam if loaded is not None else ...

  def create():
    # What is not returned (weights loaded instead) is never computed.
    return nnx.split(transformer.create(cfg, seed=seed))[1].filter(keep)

  created = jax.jit(create, out_shardings=shardings)()
  return created if loaded is None else nnx.merge_state(created, loaded)


def quantized(setup: Setup, value_head: bool, weights: nnx.State):
  """A QLoRA model's ``weights``, loaded in floating point, quantized where
  they lie (else ``weights``)."""
  cfg = _model(setup, value_head)
  if cfg.lora is None or not cfg.lora.quantize:
    return weights
  _, abstract, shardings = abstract_model(setup, value_head)
  abstract, shardings = (
    abstract.filter(lora.WEIGHTS),
    shardings.filter(lora.WEIGHTS),
  )
  quantize = jax.jit(
    functools.partial(transformer.quantize_weights, cfg),
    out_shardings=nnx.to_pure_dict(shardings),
  )
  nnx.replace_by_pure_dict(abstract, quantize(nnx.to_pure_dict(weights)))
  return abstract


def optimizer_shardings(tx, params, param_shardings, mesh):
  """Abstract ``tx.init(params)`` and its shardings: moments sharded like
  the parameters, scalars (step counts) replicated over the whole mesh."""
  shapes = jax.eval_shape(tx.init, params)
  shardings = optax.tree_map_params(
    tx,
    lambda _, s: s,
    shapes,
    param_shardings,
    transform_non_params=lambda _: sharding.replicated(mesh),
  )
  return shapes, shardings


def optimizer_state(tx, params, mesh):
  """``tx.init(params)``, committed to its shardings (so the state a step
  returns matches the one it was given, and nothing recompiles)."""
  _, shardings = optimizer_shardings(
    tx, params, jax.tree.map(lambda x: x.sharding, params), mesh
  )
  return jax.jit(tx.init, out_shardings=shardings)(params)


def policy_optimizer_state(learner: Learner, policy: Any, mesh):
  """The policy's optimizer state: of its adapters only, with them."""
  return optimizer_state(learner.policy_tx, trainable(learner, policy)[0], mesh)


def keeps_reference(setup: Setup, learner: Learner) -> bool:
  """Whether the train state holds a copy of the initial policy: for the
  KL term (its reference; with adapters their frozen weights serve), and
  for a think-mode warm start, which samples its reasoning from it."""
  think_sft = setup.config.sft.steps > 0 and setup.config.rollout.enable_think
  return not learner.adapters and (
    setup.config.algo.uses_reference or think_sft
  )


def init_state(setup: Setup, learner: Learner) -> TrainState:
  """A fresh train state, parameters and optimizer moments sharded."""
  seed = setup.config.seed
  policy = parameters(setup, False, seed)
  critic = critic_opt = None
  if learner.critic_def is not None:
    critic = parameters(setup, True, seed + 1)
    critic_opt = optimizer_state(learner.critic_tx, critic, setup.mesh)
  # Scalars (step, key, counters) are replicated over the mesh; creating
  # them inside a jit works the same on one host and on many.
  step, key, nonfinite = jax.jit(
    lambda: (
      jnp.zeros((), jnp.int32),
      jax.random.key(seed),
      jnp.zeros((), jnp.int32),
    ),
    out_shardings=sharding.replicated(setup.mesh),
  )()
  return TrainState(
    step=step,
    policy=policy,
    policy_opt=policy_optimizer_state(learner, policy, setup.mesh),
    critic=critic,
    critic_opt=critic_opt,
    # With adapters the frozen weights are the reference: no copy.
    reference=(
      jax.tree.map(jnp.copy, policy)
      if keeps_reference(setup, learner)
      else None
    ),
    key=key,
    nonfinite=nonfinite,
  )


def initial_policy(setup: Setup) -> nnx.State:
  """The policy a run starts from: the checkpoint's weights (a packaged
  preset's included), or weights created from the seed; with adapters,
  new ones on them."""
  return parameters(setup, False, setup.config.seed)
