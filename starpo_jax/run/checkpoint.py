"""Orbax checkpoints of the train state: save, find the latest, restore.

Checkpoints are written atomically (a checkpoint directory appears only
once complete), so a run killed mid-save resumes from the previous one.

Each checkpoint holds two items: ``state`` (the train state's arrays) and
``run`` (JSON: ``{"base": null}``, or for a LoRA run ``{"base": {"source":
..., "digest": ...}}``). A LoRA run's ``state`` holds its adapters, not the
frozen weights they adapt (its base): restoring rebuilds the base where the
run got it and checks its ``digest`` first, so adapters are never put on
weights they were not trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from starpo_jax.algo.state import TrainState


class BaseMismatch(ValueError):
  """A LoRA checkpoint's adapters were trained on other base weights."""


class DamagedCheckpoint(ValueError):
  """A checkpoint that cannot be read back as this run's state."""


@contextlib.contextmanager
def _reading(where: str, step: int, steps: list[int]) -> Iterator[None]:
  """Whatever stops Orbax reading step ``step`` in ``where`` (a file cut
  short or missing, another model's shapes) as ``DamagedCheckpoint``
  naming the checkpoint; nothing is deleted."""
  try:
    yield
  except (BaseMismatch, DamagedCheckpoint):
    raise
  except Exception as e:
    raise DamagedCheckpoint(
      f"{os.path.join(where, str(step))}: cannot be restored "
      f"({type(e).__name__}: {str(e)[:300]}); nothing was changed there "
      f"(its steps: {steps}): move this one aside to resume from an "
      "earlier one"
    ) from None


def _bits(x: jax.Array) -> jax.Array:
  """``x``'s values as uint32: floats by their bit pattern, integers
  (quantized weights, int4 included) by value."""
  if jnp.issubdtype(x.dtype, jnp.floating):
    unsigned = {2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    x = jax.lax.bitcast_convert_type(x, unsigned)
  return x.astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
  """Two 32-bit sums of each element's bits hashed with its position.
  Integer sums wrap and commute, so any sharding gives the same value."""
  index = jnp.zeros(x.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(x.ndim)):
    iota = jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    index = index + iota * jnp.uint32(stride % 2**32)
    stride *= x.shape[axis]
  out = []
  for mult in (0x85EBCA6B, 0xC2B2AE35):
    h = _bits(x) ^ (index * jnp.uint32(0x9E3779B9))
    h = h * jnp.uint32(mult)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0x27D4EB2F)
    h = h ^ (h >> 16)
    out.append(jnp.sum(h, dtype=jnp.uint32))
  return jnp.stack(out)


_fingerprints = jax.jit(lambda leaves: [_fingerprint(x) for x in leaves])


def digest(params: nnx.State) -> str:
  """A digest of the values of ``params`` (with their names, shapes and
  dtypes), computed where they lie: no copy to the host, the same on any
  mesh."""
  flat = sorted(
    (jax.tree_util.keystr(path), x)
    for path, x in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(params))
  )
  prints = _fingerprints([x for _, x in flat])
  h = hashlib.sha256()
  for (name, x), fp in zip(flat, prints, strict=True):
    value = np.asarray(fp.addressable_data(0)).tolist()
    h.update(f"{name} {x.dtype} {tuple(x.shape)} {value}\n".encode())
  return h.hexdigest()[:16]


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(
    x.dtype, jax.dtypes.prng_key
  )


def _to_saveable(state: TrainState, adapters: bool) -> dict[str, Any]:
  """Every field of the state as plain arrays: model states as pure
  dicts (of the policy, only its adapters with ``adapters``), PRNG keys as
  their data."""
  out = {}
  for field in dataclasses.fields(state):
    value = getattr(state, field.name)
    if adapters and field.name == "policy":
      value = value.filter(nnx.LoRAParam)
    if isinstance(value, nnx.State):
      value = nnx.to_pure_dict(value)
    elif _is_key(value):
      value = jax.random.key_data(value)
    out[field.name] = value
  return out


def _from_saveable(saved: dict[str, Any], like: TrainState) -> TrainState:
  """``like`` with the saved values (a policy's adapters alone replace
  only the adapters)."""
  values = {}
  for field in dataclasses.fields(like):
    template, value = getattr(like, field.name), saved[field.name]
    if isinstance(template, nnx.State):
      nnx.replace_by_pure_dict(template, value)
      value = template
    elif _is_key(template):
      value = jax.random.wrap_key_data(value)
    values[field.name] = value
  return TrainState(**values)


class Checkpointer:
  """The run's checkpoints: the latest ``keep``, and every step of
  ``also_keep`` (the warm start's last, so it can be evaluated after RL)."""

  def __init__(
    self, directory: str, keep: int, also_keep: tuple[int, ...] = ()
  ) -> None:
    policies = ocp.checkpoint_managers
    kept = policies.AnyPreservationPolicy(
      [policies.LatestN(keep), policies.CustomSteps(list(also_keep))]
    )
    self.manager = ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(
        preservation_policy=kept, create=True
      ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(
    self, step: int, state: TrainState, base: dict[str, str] | None = None
  ) -> None:
    """Saves ``state``; with ``base`` (a LoRA run's ``{"source", "digest"}``)
    its policy's adapters and the base's description, not its weights."""
    self.manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(_to_saveable(state, base is not None)),
        run=ocp.args.JsonSave({"base": base}),
      ),
    )

  def restore(
    self, step: int, like: TrainState, base: dict[str, str] | None = None
  ) -> TrainState:
    """Restores onto the structure, dtypes and shardings of ``like``; with
    ``base`` (the description of the weights in ``like``), the adapters.

    Raises:
      BaseMismatch: the checkpoint's adapters were trained on another base,
        or it is not of a LoRA run and ``base`` is given (or the reverse).
      DamagedCheckpoint: it cannot be read back onto ``like`` (a file cut
        short or missing, another model's shapes).
    """
    with _reading(self.directory, step, sorted(self.manager.all_steps())):
      saved_base = self._restore_run(step)["base"]
      check_base(saved_base, base, f"step {step} in {self.directory}")
      abstract = jax.tree.map(
        ocp.utils.to_shape_dtype_struct, _to_saveable(like, base is not None)
      )
      saved = self.manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)),
      )
      return _from_saveable(saved["state"], like)

  def _restore_run(self, step: int) -> dict[str, Any]:
    return self.manager.restore(
      step, args=ocp.args.Composite(run=ocp.args.JsonRestore())
    )["run"]

  @property
  def directory(self) -> str:
    return str(self.manager.directory)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def check_base(
  saved: dict[str, str] | None, base: dict[str, str] | None, where: str
) -> None:
  """Raises BaseMismatch unless a checkpoint's base (``saved``) is ``base``."""
  if saved is None and base is None:
    return
  if saved is None:
    raise BaseMismatch(
      f"the checkpoint at {where} is of a run without LoRA adapters; this "
      "run has them (start it from that run with config.train.init_from)"
    )
  if base is None:
    raise BaseMismatch(
      f"the checkpoint at {where} holds LoRA adapters (base: "
      f"{saved['source']}); this run has none (set config.model.lora as "
      "that run did)"
    )
  if saved["digest"] != base["digest"]:
    raise BaseMismatch(
      f"the checkpoint at {where} holds LoRA adapters trained on "
      f"{saved['source']} (base digest {saved['digest']}), but this run's "
      f"base, {base['source']}, has digest {base['digest']}: point "
      "config.train.init_from or config.model.ckpt at the weights it was "
      "trained on"
    )


def load_policy(
  directory: str, step: int | None = None
) -> tuple[int, dict[str, Any], dict[str, str] | None]:
  """The policy parameters (a pure dict) of the checkpoint at ``step``
  (default: the latest) in ``directory`` (a run's workdir or its
  ``checkpoints`` folder), read without touching it, and its base: for a
  LoRA run the parameters are the adapters and the base says which
  weights they adapt (else None).

  Raises:
    FileNotFoundError: no checkpoint there, or none at ``step`` (the
      message lists the steps there are).
    DamagedCheckpoint: the chosen one cannot be read.
  """
  for where in (os.path.join(directory, "checkpoints"), directory):
    if not os.path.isdir(where):
      continue
    # Orbax reads only absolute paths; users give relative ones.
    manager = ocp.CheckpointManager(
      os.path.abspath(where), options=ocp.CheckpointManagerOptions(create=False)
    )
    steps = sorted(manager.all_steps())
    if not steps:
      manager.close()
      continue
    if step is not None and step not in steps:
      manager.close()
      raise FileNotFoundError(
        f"no checkpoint at step {step} in {where!r}; it has steps {steps}"
      )
    chosen = steps[-1] if step is None else step
    try:
      with _reading(where, chosen, steps):
        saved = manager.restore(
          chosen,
          args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), run=ocp.args.JsonRestore()
          ),
        )
    finally:
      manager.close()
    return chosen, saved["state"]["policy"], saved["run"]["base"]
  raise FileNotFoundError(f"no checkpoint in {directory!r}")
