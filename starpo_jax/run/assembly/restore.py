"""Policies restored from checkpoints: a run's own (resume, evaluation),
another run's (``train.init_from``), and a LoRA run's adapters on the
weights they were trained on (checked by digest)."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from flax import nnx

from starpo_jax.algo.state import TrainState
from starpo_jax.models import lora
from starpo_jax.run import checkpoint
from starpo_jax.run.assembly.config import ConfigError
from starpo_jax.run.assembly.setup import Setup, build
from starpo_jax.run.assembly.state import abstract_model, parameters, quantized


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
  except (FileNotFoundError, checkpoint.DamagedCheckpoint) as e:
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
  _, abstract, shardings = abstract_model(setup, False, weights_only)
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
    return step, quantized(setup, False, abstract)
  return step, nnx.merge_state(abstract, weights) if adapted else abstract


def _base_weights(setup: Setup) -> nnx.State:
  """A LoRA run's frozen weights: the policy of ``train.init_from``'s run,
  else the model's (loaded from ``model.ckpt``, or created from the seed)."""
  source = setup.config.train.init_from
  if source:
    what = "config.train.init_from"
    return load_policy(setup, source, what=what, weights_only=True)[1]
  return parameters(setup, False, setup.config.seed).filter(lora.WEIGHTS)


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


def final_params(workdir: str, config: Any) -> Any:
  """The policy parameters of the latest checkpoint of the run in
  ``workdir`` built from ``config`` (for tests and export)."""
  _, policy = load_policy(build(config), workdir, what="workdir")
  return jax.tree.map(np.asarray, nnx.to_pure_dict(policy))
