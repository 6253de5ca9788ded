"""Low-rank adapters (LoRA) on the transformer's layers, through qwix.

Each targeted projection ``y = x W`` becomes ``y = x W + (alpha / rank) *
(x A) B`` with ``A`` ``[in, rank]`` (He-uniform) and ``B`` ``[rank, out]``
(zeros, so a new adapter changes nothing). qwix's ``LoraProvider``
intercepts the layer's einsums and creates ``A`` and ``B`` as
``nnx.LoRAParam`` beside each weight it finds; the weights stay plain
``nnx.Param`` (``WEIGHTS`` filters them from the adapters).

qwix is applied to one layer (``Block``) at a time, inside the ``vmap``
that stacks the layers: the adapters are stacked along ``layers`` like the
weights (logical axes from the weight's, the rank axis unsharded) and run
in the same layer scan. Applied to the whole model, qwix would add state
that is not stacked, which the scan cannot take.

``merged`` folds the adapters into the weights (what a Hugging Face export
of an adapted model holds).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

# The frozen weights: every parameter but the adapters (an nnx.LoRAParam is
# an nnx.Param too).
WEIGHTS = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
# A layer's modules the adapters can target, and the projections in each.
MODULES = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}


def targeted(cfg: Any) -> tuple[str, ...]:
  """The modules of a layer that ``cfg.lora.targets`` selects."""
  return tuple(m for m in MODULES if re.fullmatch(cfg.lora.targets, m))


def _sizes(cfg: Any) -> dict[str, tuple[int, int]]:
  """Each projection's (input, output) size."""
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
  return {
    "q": (d, q),
    "k": (d, kv),
    "v": (d, kv),
    "o": (q, d),
    "gate": (d, f),
    "up": (d, f),
    "down": (f, d),
  }


def validate(cfg: Any) -> None:
  """Raises ValueError naming a bad ``cfg.lora`` setting."""
  lora = cfg.lora
  if not isinstance(lora.rank, int) or lora.rank < 1:
    raise ValueError(
      f"model.lora: rank must be a positive integer, got {lora.rank}"
    )
  if not lora.alpha > 0:
    raise ValueError(f"model.lora: alpha must be positive, got {lora.alpha}")
  try:
    modules = targeted(cfg)
  except re.error as e:
    raise ValueError(
      f"model.lora: targets={lora.targets!r} is not a regular expression ({e})"
    ) from None
  if not modules:
    raise ValueError(
      f"model.lora: targets={lora.targets!r} matches none of a layer's "
      f"modules {tuple(MODULES)}"
    )
  sizes = _sizes(cfg)
  for module in modules:
    for name in MODULES[module]:
      if lora.rank > min(sizes[name]):
        raise ValueError(
          f"model.lora: rank={lora.rank} exceeds the {module}.{name} "
          f"projection ({sizes[name][0]} -> {sizes[name][1]})"
        )


def adapt(block: nnx.Module, cfg: Any, inv_freq: jax.Array, rngs: nnx.Rngs):
  """``block`` with adapters on its targeted projections (qwix runs the
  block once on a one-token input to find them)."""
  lora = cfg.lora
  provider = qwix.LoraProvider(
    module_path=lora.targets, rank=lora.rank, alpha=float(lora.alpha)
  )
  x = jnp.zeros((1, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  positions = jnp.zeros((1, 1), jnp.int32)
  adapted = qwix.apply_lora_to_model(
    block, provider, x, positions, inv_freq, None, rngs=rngs
  )
  want = {
    f"{n}_lora_{ab}" for m in targeted(cfg) for n in MODULES[m] for ab in "ab"
  }
  got = {
    str(path[-1])
    for path, _ in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam))
  }
  if got != want:
    # qwix finds a weight by identity: a cast to another compute dtype
    # hides it.
    raise ValueError(
      f"model.lora: adapters for {sorted(want - got)} could not be attached "
      f"(param_dtype={cfg.param_dtype!r}, dtype={cfg.dtype!r}: they must be "
      "the same)"
    )
  return adapted


def merged(model: nnx.Module) -> nnx.State:
  """The model's state with each adapter folded into its weight, ``W +
  (alpha / rank) A B``, and no adapters: the parameters of the plain
  model with the same outputs."""
  cfg = model.cfg
  scale = cfg.lora.alpha / cfg.lora.rank
  params = nnx.to_pure_dict(nnx.state(model, WEIGHTS))
  adapters = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))
  layers = params["layers"]
  for module in targeted(cfg):
    for name in MODULES[module]:
      w = layers[module][name]
      a = adapters["layers"][module][f"{name}_lora_a"]
      b = adapters["layers"][module][f"{name}_lora_b"]
      # A: [L, *in, r] and B: [L, r, *out], in and out as W's axes split.
      delta = jnp.einsum(
        a.reshape(a.shape[0], -1, a.shape[-1]).astype(jnp.float32),
        [0, 1, 2],
        b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32),
        [0, 2, 3],
        [0, 1, 3],
      ).reshape(w.shape)
      layers[module][name] = (w.astype(jnp.float32) + scale * delta).astype(
        w.dtype
      )
  return params
