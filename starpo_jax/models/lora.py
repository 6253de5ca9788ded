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

QLoRA (``quantize``): qwix stores each targeted weight quantized (int8,
int4 or nf4; a ``{"array": {"qvalue", "scale"}}`` subtree in the state)
and computes the projection from it; the adapters stay in the compute
dtype. ``quantized`` quantizes weights loaded in floating point.

``merged`` folds the adapters into the (dequantized) weights: what a
Hugging Face export of an adapted model holds.
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
# The weight types QLoRA stores the targeted weights in (qwix's names).
QTYPES = ("int8", "int4", "nf4")


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
  _validate_quantize(cfg, modules)


def _validate_quantize(cfg: Any, modules: tuple[str, ...]) -> None:
  lora = cfg.lora
  if lora.quantize not in ("", *QTYPES):
    raise ValueError(
      f"model.lora: quantize={lora.quantize!r}; expected one of {QTYPES} "
      "(or empty: not quantized)"
    )
  if not isinstance(lora.tile_size, int) or lora.tile_size < 0:
    raise ValueError(
      f"model.lora: tile_size must be a non-negative integer, got "
      f"{lora.tile_size}"
    )
  if not lora.tile_size:
    return
  if not lora.quantize:
    raise ValueError("model.lora: tile_size is for quantize (QLoRA) only")
  # Tiles run along each projection's last contracted axis.
  contracted = {
    "q": cfg.hidden_size,
    "k": cfg.hidden_size,
    "v": cfg.hidden_size,
    "o": cfg.head_dim,
    "gate": cfg.hidden_size,
    "up": cfg.hidden_size,
    "down": cfg.intermediate_size,
  }
  for module in modules:
    for name in MODULES[module]:
      if contracted[name] % lora.tile_size:
        raise ValueError(
          f"model.lora: tile_size={lora.tile_size} does not divide the "
          f"{module}.{name} projection's contracted axis "
          f"({contracted[name]})"
        )


def _provider(cfg: Any) -> qwix.LoraProvider:
  lora = cfg.lora
  return qwix.LoraProvider(
    module_path=lora.targets,
    rank=lora.rank,
    alpha=float(lora.alpha),
    weight_qtype=lora.quantize or None,
    tile_size=lora.tile_size or None,
  )


def adapt(block: nnx.Module, cfg: Any, inv_freq: jax.Array, rngs: nnx.Rngs):
  """``block`` with adapters on its targeted projections (qwix runs the
  block once on a one-token input to find them)."""
  x = jnp.zeros((1, 1, cfg.hidden_size), jnp.dtype(cfg.dtype))
  positions = jnp.zeros((1, 1), jnp.int32)
  inputs = (x, positions, inv_freq, None)
  if cfg.lora.quantize:
    # Quantized first, then adapted: qwix then finds each weight by the
    # identity of its quantized array (k and v, gate and up, have the same
    # shapes: qwix's fallback by shape cannot tell them apart).
    rule = qwix.QuantizationRule(
      module_path=cfg.lora.targets,
      weight_qtype=cfg.lora.quantize,
      tile_size=cfg.lora.tile_size or None,
    )
    block = qwix.quantize_model(block, qwix.PtqProvider([rule]), *inputs)
    # qwix leaves an empty (static) rngs slot on each module it ran; the
    # LoRA pass stores its rngs there as data.
    for _, module in nnx.iter_modules(block):
      if "qwix_rngs" in vars(module):
        delattr(module, "qwix_rngs")
  adapted = qwix.apply_lora_to_model(block, _provider(cfg), *inputs, rngs=rngs)
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


def _dequantized(model: nnx.Module, module: str, name: str) -> jax.Array:
  """A QLoRA weight (stacked over the layers) in floating point."""
  w = getattr(getattr(model.layers, module), name)
  values = jax.tree.map(
    lambda v: v[...], w.array, is_leaf=lambda v: isinstance(v, nnx.Variable)
  )
  return qwix.dequantize(values)


def merged(model: nnx.Module) -> dict[str, Any]:
  """The parameters (a pure dict) of the plain model with the same outputs
  as ``model``: each adapter folded into its (dequantized) weight, ``W +
  (alpha / rank) A B``, and no adapters."""
  cfg = model.cfg
  scale = cfg.lora.alpha / cfg.lora.rank
  params = nnx.to_pure_dict(nnx.state(model, WEIGHTS))
  adapters = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))
  layers = params["layers"]
  dtype = jnp.dtype(cfg.param_dtype)
  for module in targeted(cfg):
    for name in MODULES[module]:
      w = layers[module][name]
      if cfg.lora.quantize:
        w = _dequantized(model, module, name)
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
        dtype
      )
  return params
