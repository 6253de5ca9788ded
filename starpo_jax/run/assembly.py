"""A run assembled from its config: environments, tokenizer, model, step
settings (``build``); the policy's and critic's definitions and optimizers
(``make_learner``); the train state, created sharded or restored
(``init_state``, ``load_policy``); the compiled steps.

Everything is checked on the host before anything compiles: unknown keys
and wrong types are refused by ``ml_collections``, values here, each
error naming its setting (``ConfigError``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

import envs
from starpo_jax import settings, sharding
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo import diagnostics, filtering, sft
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.experts import Replies
from starpo_jax.algo.spec import StepSpec
from starpo_jax.algo.state import CRITIC_OWN, Learner, TrainState, trainable
from starpo_jax.algo.step import make_step
from starpo_jax.models import checkpoints, lora, transformer
from starpo_jax.models import tokenizer as tokenizer_lib
from starpo_jax.run import checkpoint, sections, stopping

# The run's config, as JSON, in its workdir.
CONFIG_FILE = "config.json"


# The settings that name files a run reads (its config.json holds them
# absolute: the run can be evaluated from another directory).
PATHS = (
  ("model", "ckpt"),
  ("model", "tokenizer"),
  ("train", "init_from"),
)


class ConfigError(ValueError):
  """A setting that cannot work; the message names it."""


@dataclasses.dataclass
class Setup:
  """Everything a run is made of, built and checked on the host."""

  config: ml_collections.ConfigDict
  env: Any
  eval_envs: dict[str, Any]
  tokenizer: tokenizer_lib.Tokenizer
  rollout_cfg: rollout.RolloutConfig
  algo: AlgoConfig
  filter_cfg: filtering.FilterConfig
  sft_cfg: sft.SftConfig
  stop_cfg: stopping.StopConfig
  diag_cfg: diagnostics.DiagnosticsConfig
  model_cfg: transformer.ModelConfig
  # The weights' checkpoint: model.ckpt, or the file of a packaged preset
  # (checkpoints.PACKAGED); "" for random weights.
  ckpt: str
  codec: codec_lib.Codec
  eval_codecs: dict[str, codec_lib.Codec]
  mesh: Any


def check_sections(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Every section of ``config`` as its dataclass (``run/sections.py``),
  which checks its settings' types, choices and ranges; the first bad one
  raises ``ConfigError`` naming it."""
  known = {*sections.SECTIONS, "seed", "logical_axis_rules"}
  unknown = sorted(set(config) - known)
  if unknown:
    raise ConfigError(
      f"config: unknown sections {unknown}; known: {sorted(known)}"
    )
  if not isinstance(config.seed, int):
    raise ConfigError(f"config.seed={config.seed!r}; expected an integer")
  out = {}
  for name, cls in sections.SECTIONS.items():
    try:
      out[name] = settings.from_mapping(cls, config[name], name)
    except ValueError as e:
      raise ConfigError(f"config.{e}") from None
  return out


def changed_settings(config: ml_collections.ConfigDict) -> list[str]:
  """``section.key=value`` for every setting of ``config`` that differs
  from its section's default, nested sections flattened, in the order of
  ``sections.SECTIONS``."""
  out = [f"seed={config.seed}"] if config.seed != 0 else []

  def walk(prefix: str, got: dict[str, Any], default: dict[str, Any]) -> None:
    for key, value in got.items():
      base = default.get(key)
      if isinstance(value, dict) and isinstance(base, dict):
        walk(f"{prefix}.{key}", value, base)
      elif value != base:
        out.append(f"{prefix}.{key}={value!r}")

  for name, cls in sections.SECTIONS.items():
    walk(name, config[name].to_dict(), settings.defaults(cls))
  return out


def _check_lora(model_cfg, sft_cfg) -> None:
  """Raises ConfigError for LoRA settings the trainer cannot run."""
  if model_cfg.lora is not None and sft_cfg.steps:
    raise ConfigError(
      "config.model.lora: the warm start (config.sft.steps) trains the "
      "whole model; run it without adapters, then start the LoRA run from "
      "it with config.train.init_from"
    )


def build(
  config: ml_collections.ConfigDict,
  shapes_only: bool = False,
  devices: Any = None,
) -> Setup:
  """Checks the config and builds environments, tokenizer and codecs.

  With ``shapes_only`` (the compile check), a preset without a checkpoint
  or tokenizer gets the compact tokenizer: token ids change, shapes do not.
  ``devices`` (default: all) make the mesh.
  """
  typed = check_sections(config)
  env, eval_envs = _environments(typed["env"])
  rollout_cfg, algo = typed["rollout"], typed["algo"]
  filter_cfg, sft_cfg = typed["filter"], typed["sft"]
  stop_cfg, diag_cfg = typed["train"].early_stop, typed["diagnostics"]
  if rollout_cfg.batch % algo.minibatches:
    raise ConfigError(
      f"config.algo.minibatches={algo.minibatches} must divide the "
      f"{rollout_cfg.batch} episodes (rollout.env_groups x rollout.group_size)"
    )
  if env.spec.tools and rollout_cfg.max_turns < 2:
    raise ConfigError(
      f"config.env.kwargs.tools={','.join(env.spec.tools)!r}: a tool's "
      "result comes back in the next turn, so rollout.max_turns="
      f"{rollout_cfg.max_turns} leaves no turn to read it; set it to 2 or more"
    )
  prompt = rollout_cfg.prompt_settings()
  ckpt = _checkpoint(typed["model"])
  tok = _tokenizer(
    typed["model"], ckpt, [env, *eval_envs.values()], prompt, shapes_only
  )
  # Python environments tokenize their observations on the host; on a
  # mesh, each process steps the episodes of its own batch shards.
  bind = lambda e: e.bind(tok.encode, sharding.BATCH)
  env, eval_envs = bind(env), {n: bind(e) for n, e in eval_envs.items()}
  model_cfg = _model_config(typed["model"], ckpt, tok)
  _check_lora(model_cfg, sft_cfg)
  build = lambda e: codec_lib.Codec.build(
    tok, e.spec, prompt, model_cfg.vocab_size, sharding.BATCH
  )
  codec, eval_codecs = build(env), {n: build(e) for n, e in eval_envs.items()}
  try:
    mesh = sharding.make_mesh(config.mesh.shape, devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if sft_cfg.steps:
    try:
      sft.check(
        env,
        sft.episodes_config(rollout_cfg, sft_cfg, codec),
        Replies.build(tok, env.spec, rollout_cfg.enable_think),
        sft_cfg.expert,
        sft_cfg.reasoning_tokens,
      )
    except ValueError as e:
      raise ConfigError(f"config.{e}") from None
  return Setup(
    config=config,
    env=env,
    eval_envs=eval_envs,
    tokenizer=tok,
    rollout_cfg=rollout_cfg,
    algo=algo,
    filter_cfg=filter_cfg,
    sft_cfg=sft_cfg,
    stop_cfg=stop_cfg,
    diag_cfg=diag_cfg,
    model_cfg=model_cfg,
    ckpt=ckpt,
    codec=codec,
    eval_codecs=eval_codecs,
    mesh=mesh,
  )


def _environments(c: sections.EnvConfig) -> tuple[Any, dict[str, Any]]:
  """The training environment and the evaluation ones by name: ``eval``
  with ``env.eval_kwargs`` applied and, when those change anything, the
  training environment again as ``eval_train_env``."""
  try:
    env = envs.batched(envs.make(c.name, **c.kwargs))
    eval_envs = {
      "eval": envs.batched(envs.make(c.name, **{**c.kwargs, **c.eval_kwargs}))
    }
  except ValueError as e:
    raise ConfigError(f"config.env: {e}") from None
  if c.eval_kwargs:
    eval_envs["eval_train_env"] = env
  return env, eval_envs


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
  """A checkpoint or tokenizer that cannot be read is a setting that
  cannot work: its error (naming the file) as ``ConfigError``."""
  try:
    yield
  except (checkpoints.CheckpointError, tokenizer_lib.TokenizerError) as e:
    raise ConfigError(f"config.model: {e}") from None


def _checkpoint(m: sections.ModelSettings) -> str:
  """``model.ckpt``, else a packaged preset's file, else ""."""
  name = m.ckpt or (m.preset if m.preset in checkpoints.PACKAGED else "")
  if not name:
    return ""
  with _as_config_error():
    return checkpoints.resolve(name)


def _tokenizer(
  m: sections.ModelSettings,
  ckpt: str,
  all_envs: list[Any],
  prompt: codec_lib.PromptSettings,
  shapes_only: bool,
) -> tokenizer_lib.Tokenizer:
  """The checkpoint's (or ``model.tokenizer``'s) tokenizer; for the tiny
  model (or a compile check) the compact one over the prompts' pieces."""
  tok_path = m.tokenizer or ckpt
  if tok_path:
    with _as_config_error():
      return checkpoints.tokenizer(tok_path)
  if m.preset == "tiny" or shapes_only:
    pieces = []
    for e in all_envs:
      pieces += codec_lib.prompt_pieces(e.spec, prompt)
    return tokenizer_lib.build_compact(pieces)
  raise ConfigError(
    f"config.model: preset {m.preset!r} needs model.ckpt or model.tokenizer"
  )


def _model_config(
  m: sections.ModelSettings, ckpt: str, tok: tokenizer_lib.Tokenizer
) -> transformer.ModelConfig:
  """The checkpoint's architecture, the tiny shape of ``config.model``, or
  a preset's, with the run's dtypes, remat and attention kernel."""
  if ckpt:
    with _as_config_error():
      model_cfg = checkpoints.read_config(ckpt)
    model_cfg = model_cfg.replace(dtype=m.dtype, param_dtype=m.param_dtype)
  elif m.preset == "tiny":
    model_cfg = transformer.ModelConfig(
      **{
        **dataclasses.asdict(transformer.PRESETS["tiny"]),
        "rope_scaling": None,
        "vocab_size": tok.vocab_size,
        "hidden_size": m.hidden_size,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "intermediate_size": m.intermediate_size,
        "dtype": m.dtype,
        "param_dtype": m.param_dtype,
      }
    )
  else:
    model_cfg = transformer.PRESETS[m.preset].replace(
      dtype=m.dtype, param_dtype=m.param_dtype
    )
  model_cfg = model_cfg.replace(remat=m.remat, attention=m.attention)
  if m.lora.rank:
    model_cfg = model_cfg.replace(
      lora=transformer.LoraConfig(
        rank=m.lora.rank,
        alpha=m.lora.alpha,
        targets=m.lora.targets,
        quantize=m.lora.quantize,
        tile_size=m.lora.tile_size,
      )
    )
  try:
    model_cfg = transformer.validate(model_cfg)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if model_cfg.vocab_size < tok.vocab_size:
    raise ConfigError(
      f"config.model: the tokenizer has {tok.vocab_size} tokens, more than "
      f"the model's vocab_size={model_cfg.vocab_size}"
    )
  return model_cfg


def optimizer(
  lr: float, warmup_steps: int, o: ml_collections.ConfigDict
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


def _model(setup: Setup, value_head: bool) -> transformer.ModelConfig:
  """The policy's model, or the critic's: a value head, and the policy's
  adapters where it shares the policy's frozen weights."""
  if not value_head:
    return setup.model_cfg
  shares = setup.config.model.lora.critic == "adapters"
  lora_cfg = setup.model_cfg.lora if shares else None
  return setup.model_cfg.replace(value_head=True, lora=lora_cfg)


def _critic_shares_base(setup: Setup) -> bool:
  return setup.algo.uses_critic and _model(setup, True).lora is not None


def _unquantized(cfg: transformer.ModelConfig) -> transformer.ModelConfig:
  """``cfg`` with its QLoRA weights in floating point (as they load)."""
  if cfg.lora is None or not cfg.lora.quantize:
    return cfg
  return cfg.replace(
    lora=dataclasses.replace(cfg.lora, quantize="", tile_size=0)
  )


def _abstract_model(setup: Setup, value_head: bool, unquantized=False):
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
  if setup.algo.uses_critic:
    critic_def = _abstract_model(setup, True)[0]
    critic_tx = optimizer(o.critic_lr, o.warmup_steps, o)
  return Learner(
    policy_def=_abstract_model(setup, False)[0],
    policy_tx=optimizer(o.lr, o.warmup_steps, o),
    critic_def=critic_def,
    critic_tx=critic_tx,
    critic_shares_base=_critic_shares_base(setup),
    adapters=setup.model_cfg.lora is not None,
  )


def sft_optimizer(setup: Setup) -> optax.GradientTransformation:
  s = setup.sft_cfg
  return optimizer(s.lr, s.warmup_steps, setup.config.optim)


def _parameters(setup: Setup, value_head: bool, seed: int):
  """A model's parameters, created (or loaded) already sharded over
  ``setup.mesh`` (no full copy on one device). From a Hugging Face
  checkpoint, its weights and new adapters. A critic that shares the
  policy's weights: its adapters and value head only."""
  m = setup.config.model
  cfg = _model(setup, value_head)
  _, _, shardings = _abstract_model(setup, value_head)
  own = value_head and _critic_shares_base(setup)
  loaded = None
  if own:
    shardings = shardings.filter(CRITIC_OWN)
  elif setup.ckpt:
    adapted = cfg.lora is not None
    loads = _abstract_model(setup, value_head, unquantized=True)[2]
    with _as_config_error():
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
    loaded = _quantized(setup, value_head, loaded)
    shardings = shardings.filter(nnx.LoRAParam)
  keep = CRITIC_OWN if own else nnx.LoRAParam if loaded is not None else ...

  def create():
    # What is not returned (weights loaded instead) is never computed.
    return nnx.split(transformer.create(cfg, seed=seed))[1].filter(keep)

  created = jax.jit(create, out_shardings=shardings)()
  return created if loaded is None else nnx.merge_state(created, loaded)


def _quantized(setup: Setup, value_head: bool, weights: nnx.State):
  """A QLoRA model's ``weights``, loaded in floating point, quantized where
  they lie (else ``weights``)."""
  cfg = _model(setup, value_head)
  if cfg.lora is None or not cfg.lora.quantize:
    return weights
  _, abstract, shardings = _abstract_model(setup, value_head)
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


def _optimizer_shardings(tx, params, param_shardings, mesh):
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
  _, shardings = _optimizer_shardings(
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
  think_sft = setup.sft_cfg.steps > 0 and setup.rollout_cfg.enable_think
  return not learner.adapters and (setup.algo.uses_reference or think_sft)


def init_state(setup: Setup, learner: Learner) -> TrainState:
  """A fresh train state, parameters and optimizer moments sharded."""
  seed = setup.config.seed
  policy = _parameters(setup, False, seed)
  critic = critic_opt = None
  if learner.critic_def is not None:
    critic = _parameters(setup, True, seed + 1)
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


def abstract_state(setup: Setup, learner: Learner) -> TrainState:
  """``init_state``'s result as ``jax.ShapeDtypeStruct`` with shardings,
  allocating nothing (for ahead-of-time compilation)."""
  mesh = setup.mesh
  place = lambda shapes, shardings: jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    shapes,
    shardings,
  )

  def model_and_opt(value_head, tx):
    _, abstract, shardings = _abstract_model(setup, value_head)
    if value_head and learner.critic_shares_base:
      abstract, shardings = (
        abstract.filter(CRITIC_OWN),
        shardings.filter(CRITIC_OWN),
      )
    params = place(abstract, shardings)
    if value_head or not learner.adapters:
      return params, place(*_optimizer_shardings(tx, params, shardings, mesh))
    part, _ = trainable(learner, params)
    part_shardings, _ = trainable(learner, shardings)
    return params, place(*_optimizer_shardings(tx, part, part_shardings, mesh))

  policy, policy_opt = model_and_opt(False, learner.policy_tx)
  critic = critic_opt = None
  if learner.critic_def is not None:
    critic, critic_opt = model_and_opt(True, learner.critic_tx)
  everywhere = sharding.replicated(mesh)
  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=everywhere)
  key = jax.eval_shape(lambda: jax.random.key(0))
  return TrainState(
    step=scalar,
    policy=policy,
    policy_opt=policy_opt,
    critic=critic,
    critic_opt=critic_opt,
    reference=policy if keeps_reference(setup, learner) else None,
    key=jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=everywhere),
    nonfinite=scalar,
  )


def _jit_step(fn, state: TrainState, mesh):
  """``fn(state, codec) -> (state, metrics)`` jitted with the state donated
  and explicit shardings (the state keeps its own, metrics replicated)."""
  state_sharding = jax.tree.map(lambda x: x.sharding, state)
  everywhere = sharding.replicated(mesh)
  return jax.jit(
    fn,
    donate_argnums=0,
    in_shardings=(state_sharding, everywhere),
    out_shardings=(state_sharding, everywhere),
  )


def step_spec(setup: Setup, learner: Learner) -> StepSpec:
  """The static pieces of the run's RL step."""
  return StepSpec(
    env=setup.env,
    rollout=setup.rollout_cfg,
    algo=setup.algo,
    filter=setup.filter_cfg,
    learner=learner,
    diagnostics=setup.diag_cfg,
  )


def compile_step(setup: Setup, state: TrainState, learner: Learner):
  """The jitted RL step."""
  step = make_step(step_spec(setup, learner), setup.mesh)
  return _jit_step(step, state, setup.mesh)


def compile_sft_step(setup: Setup, state: TrainState, learner: Learner):
  """The jitted supervised warm-start step."""
  spec = sft.WarmStartSpec(
    env=setup.env,
    rollout=setup.rollout_cfg,
    sft=setup.sft_cfg,
    policy_def=learner.policy_def,
    tx=sft_optimizer(setup),
    replies=Replies.build(
      setup.tokenizer, setup.env.spec, setup.rollout_cfg.enable_think
    ),
    logits_chunk=setup.algo.logits_chunk,
  )
  step = sft.make_sft_step(spec, setup.codec, setup.mesh)
  return _jit_step(step, state, setup.mesh)


def initial_policy(setup: Setup) -> nnx.State:
  """The policy a run starts from: the checkpoint's weights (a packaged
  preset's included), or weights created from the seed; with adapters,
  new ones on them."""
  return _parameters(setup, False, setup.config.seed)


def load_policy(
  setup: Setup,
  source: str,
  step: int | None = None,
  what: str = "policy",
  weights_only: bool = False,
) -> tuple[int, nnx.State]:
  """The policy of the checkpoint at ``step`` (default: the latest) of the
  run in ``source``, placed on this setup's shardings: of a LoRA run, its
  adapters on its base's weights (rebuilt as that run built them);
  ``weights_only``: the weights of this setup's adapted policy, from a run
  without adapters.

  Raises:
    ConfigError: no checkpoint there, a policy of another shape, or
      adapters on other weights (``what`` names the setting that pointed
      there).
  """
  try:
    step, pure, base = checkpoint.load_policy(source, step)
  except FileNotFoundError as e:
    raise ConfigError(f"{what}: {e}") from None
  if weights_only and base is not None:
    raise ConfigError(
      f"{what}={source!r}: the checkpoint at step {step} holds LoRA "
      f"adapters (on {base['source']}), not whole weights to adapt"
    )
  adapted = setup.model_cfg.lora is not None and not weights_only
  weights = _base_weights(setup) if adapted else None
  try:
    checkpoint.check_base(
      base,
      base_of(setup, weights) if adapted else None,
      f"step {step} of {what}={source!r}",
    )
  except checkpoint.BaseMismatch as e:
    raise ConfigError(str(e)) from None
  _, abstract, shardings = _abstract_model(setup, False, weights_only)
  keep = nnx.LoRAParam if adapted else lora.WEIGHTS
  if adapted or weights_only:
    abstract, shardings = abstract.filter(keep), shardings.filter(keep)
  template = nnx.to_pure_dict(abstract)
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  if shapes(pure) != shapes(template):
    raise ConfigError(
      f"{what}={source!r}: the policy at step {step} does not fit this "
      "model (parameter names or shapes differ)"
    )
  placed = jax.tree.map(
    lambda new, like, s: jax.device_put(np.asarray(new, like.dtype), s),
    pure,
    template,
    nnx.to_pure_dict(shardings),
  )
  nnx.replace_by_pure_dict(abstract, placed)
  if weights_only:
    return step, _quantized(setup, False, abstract)
  return step, nnx.merge_state(abstract, weights) if adapted else abstract


def _base_weights(setup: Setup) -> nnx.State:
  """A LoRA run's frozen weights: the policy of ``train.init_from``'s run,
  else the model's (loaded from ``model.ckpt``, or created from the seed)."""
  source = setup.config.train.init_from
  if source:
    what = "config.train.init_from"
    return load_policy(setup, source, what=what, weights_only=True)[1]
  return _parameters(setup, False, setup.config.seed).filter(lora.WEIGHTS)


def base_of(setup: Setup, weights: nnx.State) -> dict[str, str]:
  """What a LoRA run's checkpoints say of its frozen ``weights``: where
  they come from and their digest."""
  c = setup.config
  if c.train.init_from:
    source = f"the policy of run {os.path.abspath(c.train.init_from)}"
  elif setup.ckpt:
    source = f"the checkpoint {os.path.abspath(setup.ckpt)}"
  else:
    source = f"the model created from seed {c.seed}"
  return {"source": source, "digest": checkpoint.digest(weights)}


def policy_from(state: TrainState, setup: Setup, source: str) -> TrainState:
  """``state`` with the policy (and reference) of the latest checkpoint of
  the run in ``source``, placed with ``state``'s shardings; with adapters,
  ``state``'s own adapters on the weights found there."""
  what = "config.train.init_from"
  if setup.model_cfg.lora is not None:
    _, weights = load_policy(setup, source, what=what, weights_only=True)
    adapters, _ = state.policy.split(nnx.LoRAParam, ...)
    return state.replace(policy=nnx.merge_state(adapters, weights))
  _, policy = load_policy(setup, source, what=what)
  reference = policy if state.reference is not None else None
  return state.replace(policy=policy, reference=reference)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in ``workdir`` was started with.

  Raises:
    ConfigError: the workdir has no readable config file.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    with open(path) as f:
      saved = json.load(f)
  except FileNotFoundError:
    raise ConfigError(
      f"{path!r} does not exist: is {workdir!r} a run directory? (pass "
      "--config to evaluate a checkpoint without one)"
    ) from None
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path!r} is not valid JSON: {e}") from None
  # A run saved before a setting existed gets its default (every new
  # setting's default is the behaviour before it).
  defaults = {n: settings.defaults(c) for n, c in sections.SECTIONS.items()}
  return ml_collections.ConfigDict(_merged(defaults, saved))


def _merged(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
  """``saved`` over ``defaults``, nested mappings merged key by key."""
  out = dict(defaults)
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(defaults.get(key), dict):
      value = _merged(defaults[key], value)
    out[key] = value
  return out


def final_params(workdir: str, config: ml_collections.ConfigDict) -> Any:
  """The policy parameters of the latest checkpoint (for tests and export)."""
  _, policy = load_policy(build(config), workdir, what="workdir")
  return jax.tree.map(np.asarray, nnx.to_pure_dict(policy))
