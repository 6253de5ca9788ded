"""Hugging Face checkpoints: ``config.json`` plus ``*.safetensors``.

  model = hf.load("/path/to/Qwen2.5-0.5B-Instruct")
  hf.save(model, "/path/to/export")          # opens in transformers and vLLM
  python -m starpo_jax.hf verify PATH  # against transformers (cli/verify.py)

Safetensors files are memory-mapped and converted tensor by tensor (one
layer at a time for stacked parameters), so a model loads without a second
full copy in host memory; ``save`` streams tensors to disk the same way.
Nothing is unpickled: ``.bin`` checkpoints are refused.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from starpo_jax.models import config as model_config
from starpo_jax.models import lora
from starpo_jax.models.config import ModelConfig, RopeScaling
from starpo_jax.models.safetensors_file import (
  CheckpointError,
  SafetensorsFile,
  header_bytes,
  open_tensors,
)
from starpo_jax.models.transformer import Transformer

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
_MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama"}
# Buffers some checkpoints carry that are not parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
DEFAULT_SHARD_BYTES = 4 << 30


# ----------------------------------------------------------------------------
# config.json


def config_from_hf(hf: dict[str, Any], where: str) -> ModelConfig:
  """``config.json`` contents -> ``ModelConfig``; ``where`` names the file."""
  family = _family(hf, where)

  def need(key: str) -> Any:
    if key not in hf:
      raise CheckpointError(f"{where}: missing key {key!r}")
    return hf[key]

  heads = need("num_attention_heads")
  theta, scaling = _rope(hf, where)
  dtype = hf.get("dtype", hf.get("torch_dtype", "float32"))
  eos = hf.get("eos_token_id")
  return model_config.validate(
    ModelConfig(
      vocab_size=need("vocab_size"),
      hidden_size=need("hidden_size"),
      num_layers=need("num_hidden_layers"),
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or need("hidden_size") // heads,
      intermediate_size=need("intermediate_size"),
      family=family,
      qkv_bias=family == "qwen2",
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      rope_theta=theta,
      rope_scaling=scaling,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 32_768)),
      dtype="float32",
      param_dtype="bfloat16" if dtype == "bfloat16" else "float32",
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=eos[0] if isinstance(eos, list) else eos,
    )
  )


def _family(hf: dict[str, Any], where: str) -> str:
  """The architecture's family, refusing what the model does not
  implement."""
  archs = hf.get("architectures") or []
  known = [a for a in archs if a in ARCHITECTURES]
  if not known:
    raise CheckpointError(
      f"{where}: architectures {archs} is not supported; supported: "
      f"{', '.join(ARCHITECTURES)}"
    )
  family = ARCHITECTURES[known[0]]
  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(
      f"{where}: hidden_act {hf['hidden_act']!r} is not supported (silu only)"
    )
  if family == "qwen2" and hf.get("use_sliding_window"):
    raise CheckpointError(f"{where}: sliding-window attention is not supported")
  if family == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
    raise CheckpointError(
      f"{where}: Llama attention_bias / mlp_bias are not supported"
    )
  return family


def _rope(hf: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
  """RoPE's base and scaling, from transformers' v5 ``rope_parameters`` or
  the older ``rope_theta`` / ``rope_scaling``."""
  rope = dict(hf.get("rope_parameters") or {})
  legacy = hf.get("rope_scaling") or {}
  rope.update({k: v for k, v in legacy.items() if k not in rope})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "linear":
    return float(theta), RopeScaling("linear", float(rope["factor"]))
  if kind == "llama3":
    return float(theta), RopeScaling(
      "llama3",
      float(rope["factor"]),
      float(rope["low_freq_factor"]),
      float(rope["high_freq_factor"]),
      int(rope["original_max_position_embeddings"]),
    )
  if kind != "default":
    raise CheckpointError(f"{where}: rope type {kind!r} is not supported")
  return float(theta), None


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
  """A ``config.json`` for ``cfg`` that transformers (v4 and v5) and vLLM
  read."""
  arch = {v: k for k, v in ARCHITECTURES.items()}[cfg.family]
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  legacy_scaling = None
  if cfg.rope_scaling is not None:
    s = cfg.rope_scaling
    legacy_scaling = {"rope_type": s.kind, "factor": s.factor}
    if s.kind == "llama3":
      legacy_scaling.update(
        low_freq_factor=s.low_freq_factor,
        high_freq_factor=s.high_freq_factor,
        original_max_position_embeddings=s.original_max_position_embeddings,
      )
    rope.update(legacy_scaling)
  out = {
    "architectures": [arch],
    "model_type": _MODEL_TYPES[cfg.family],
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.hidden_size,
    "intermediate_size": cfg.intermediate_size,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "rms_norm_eps": cfg.rms_norm_eps,
    "max_position_embeddings": cfg.max_position_embeddings,
    "tie_word_embeddings": cfg.tie_embeddings,
    "rope_theta": cfg.rope_theta,
    "rope_scaling": legacy_scaling,
    "rope_parameters": rope,
    "torch_dtype": dtype,
    "dtype": dtype,
    "bos_token_id": cfg.bos_token_id,
    "eos_token_id": cfg.eos_token_id,
    "use_cache": True,
  }
  if cfg.family == "llama":
    out.update(attention_bias=False, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out


# ----------------------------------------------------------------------------
# safetensors


# ----------------------------------------------------------------------------
# parameter layout


class _Entry:
  """One of our parameters and the Hugging Face tensor(s) it comes from.

  ``to_ours`` / ``to_hf`` convert one tensor (one layer of a stacked
  parameter).
  """

  def __init__(
    self,
    path: tuple[str, ...],
    name: str,
    to_ours: Callable[[np.ndarray], np.ndarray],
    to_hf: Callable[[np.ndarray], np.ndarray],
    stacked: bool,
  ) -> None:
    self.path, self.name, self.stacked = path, name, stacked
    self.to_ours, self.to_hf = to_ours, to_hf

  def names(self, num_layers: int) -> list[str]:
    if self.stacked:
      return [self.name.format(i=i) for i in range(num_layers)]
    return [self.name]


def _layout(cfg: ModelConfig) -> list[_Entry]:
  """Every parameter: its path here, its Hugging Face name, and the
  conversions both ways (our attention weights keep heads apart)."""
  d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  same = (lambda w: w, lambda w: w)
  transpose = (lambda w: w.T, lambda w: w.T)
  heads_in = lambda n: (
    lambda w: w.T.reshape(d, n, hd),
    lambda w: w.reshape(d, n * hd).T,
  )
  heads_out = (
    lambda w: w.T.reshape(h, hd, d),
    lambda w: w.reshape(h * hd, d).T,
  )
  bias = lambda n: (lambda w: w.reshape(n, hd), lambda w: w.reshape(n * hd))
  per_layer = [
    (("attn_norm", "scale"), "input_layernorm.weight", same),
    (("mlp_norm", "scale"), "post_attention_layernorm.weight", same),
    (("attn", "q"), "self_attn.q_proj.weight", heads_in(h)),
    (("attn", "k"), "self_attn.k_proj.weight", heads_in(kv)),
    (("attn", "v"), "self_attn.v_proj.weight", heads_in(kv)),
    (("attn", "o"), "self_attn.o_proj.weight", heads_out),
    *(
      (("mlp", name), f"mlp.{name}_proj.weight", transpose)
      for name in ("gate", "up", "down")
    ),
  ]
  if cfg.qkv_bias:
    per_layer += [
      (("attn", f"{name}_bias"), f"self_attn.{name}_proj.bias", bias(n))
      for name, n in (("q", h), ("k", kv), ("v", kv))
    ]
  entries = [
    _Entry(("embed",), "model.embed_tokens.weight", *same, False),
    _Entry(("final_norm", "scale"), "model.norm.weight", *same, False),
    *(
      _Entry(("layers", *path), "model.layers.{i}." + name, *convert, True)
      for path, name, convert in per_layer
    ),
  ]
  if not cfg.tie_embeddings:
    entries.append(_Entry(("lm_head",), "lm_head.weight", *transpose, False))
  return entries


def _expected_hf_shape(entry: _Entry, ours: tuple[int, ...]) -> tuple[int, ...]:
  layer_shape = ours[1:] if entry.stacked else ours
  return entry.to_hf(np.empty(layer_shape, np.uint8)).shape


# ----------------------------------------------------------------------------
# load / save


def read_config(path: str) -> ModelConfig:
  """The ``ModelConfig`` of a Hugging Face model directory."""
  if not os.path.isdir(path):
    raise CheckpointError(f"{path}: no such directory")
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise CheckpointError(
      f"{file}: missing (a model directory needs config.json and *.safetensors)"
    )
  try:
    with open(file) as f:
      hf = json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{file}: not valid JSON: {e}") from None
  return config_from_hf(hf, file)


def load(
  path: str,
  *,
  dtype: str = "float32",
  param_dtype: str | None = None,
  value_head: bool = False,
  shardings: Any = None,
) -> Transformer:
  """Reads a local Hugging Face model directory into a ``Transformer``.

  Args:
    path: directory with ``config.json`` and one or several safetensors
      files (with ``model.safetensors.index.json`` when sharded).
    dtype: compute dtype.
    param_dtype: storage dtype; defaults to the checkpoint's.
    value_head: add a zero-initialised value head (a critic).
    shardings: optional pytree of ``jax.sharding.Sharding`` matching
      ``nnx.state(model)``; each device then reads only its shard.

  Raises:
    CheckpointError: naming the file or tensor that is missing, unexpected,
      of the wrong shape or truncated, or the unsupported setting.
  """
  return load_tensors(
    read_config(path),
    open_tensors(path),
    path,
    "config.json",
    dtype=dtype,
    param_dtype=param_dtype,
    value_head=value_head,
    shardings=shardings,
  )


def load_tensors(
  cfg: ModelConfig,
  tensors: dict[str, Any],
  where: str,
  config_name: str,
  *,
  dtype: str = "float32",
  param_dtype: str | None = None,
  value_head: bool = False,
  shardings: Any = None,
) -> Transformer:
  """A ``Transformer`` of ``cfg`` from Hugging Face-named tensors.

  ``tensors`` maps each name to a source with ``path``, ``shape(name)``
  and ``get(name)`` (a ``SafetensorsFile``, or a GGUF file's dequantizing
  view, ``gguf.py``); errors name ``where`` (the checkpoint) and
  ``config_name`` (what ``cfg`` was read from). ``load`` documents the
  other arguments.
  """
  cfg = cfg.replace(
    dtype=dtype,
    param_dtype=param_dtype or cfg.param_dtype,
    value_head=value_head,
  )
  cfg = model_config.validate(cfg)
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = dict(nnx.to_flat_state(state))
  layout = _layout(cfg)
  used: set[str] = set()
  default_sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  flat_shardings = (
    dict(nnx.to_flat_state(shardings)) if shardings is not None else {}
  )
  param_dtype_np = np.dtype(jnp.dtype(cfg.param_dtype))
  for entry in layout:
    var = flat[entry.path]
    shape = var.get_value().shape
    used |= _checked_names(cfg, entry, shape, tensors, where, config_name)
    sharding = _sharding_of(flat_shardings.get(entry.path), default_sharding)
    var.set_value(_read(entry, tensors, shape, param_dtype_np, sharding))
  for name, file in tensors.items():
    ignorable = name.endswith(_IGNORED_SUFFIXES) or (
      cfg.tie_embeddings and name == "lm_head.weight"
    )
    if name not in used and not ignorable:
      raise CheckpointError(f"{file.path}: unexpected tensor {name}")
  for var in flat.values():
    value = var.get_value()
    if isinstance(value, jax.ShapeDtypeStruct):
      # Parameters not in Hugging Face checkpoints: the value head.
      var.set_value(jnp.zeros(value.shape, value.dtype))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _checked_names(
  cfg: ModelConfig,
  entry: _Entry,
  shape: tuple[int, ...],
  tensors: dict[str, Any],
  where: str,
  config_name: str,
) -> set[str]:
  """The Hugging Face tensors ``entry`` reads, each checked to be there
  with the shape ``cfg`` (read from ``config_name``) gives it."""
  expected = _expected_hf_shape(entry, shape)
  names = set(entry.names(cfg.num_layers))
  for name in sorted(names):
    if name not in tensors:
      raise CheckpointError(f"{where}: tensor {name} is missing")
    if tensors[name].shape(name) != expected:
      raise CheckpointError(
        f"{tensors[name].path}: tensor {name} has shape "
        f"{tensors[name].shape(name)}, expected {expected} from "
        f"{config_name}"
      )
  return names


def _sharding_of(value: Any, default: Any) -> Any:
  if value is None:
    return default
  return value.get_value() if hasattr(value, "get_value") else value


def _read(
  entry: _Entry,
  tensors: dict[str, SafetensorsFile],
  shape: tuple[int, ...],
  dtype: np.dtype,
  sharding: Any,
) -> jax.Array:
  """One parameter, built shard by shard from the mapped tensors."""

  def one(name: str) -> np.ndarray:
    value = tensors[name].get(name)
    if not jnp.issubdtype(value.dtype, jnp.floating):
      raise CheckpointError(
        f"{tensors[name].path}: tensor {name} has dtype {value.dtype}, "
        "not a floating-point type"
      )
    return entry.to_ours(value)

  def callback(index: tuple[slice, ...]) -> np.ndarray:
    if not entry.stacked:
      return np.asarray(one(entry.name)[index], dtype)
    layers = range(shape[0])[index[0]]
    rest = index[1:]
    return np.stack(
      [np.asarray(one(entry.name.format(i=i))[rest], dtype) for i in layers]
    )

  return jax.make_array_from_callback(shape, sharding, callback)


def save(
  model: Transformer,
  path: str,
  *,
  dtype: str | None = None,
  max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> None:
  """Writes ``model`` as a Hugging Face directory (the value head excluded;
  LoRA adapters folded into the weights they adapt, ``lora.merged``).

  Args:
    model: the model to export.
    path: output directory (created if needed).
    dtype: tensor dtype on disk, ``"float32"`` or ``"bfloat16"``; defaults
      to the parameters' dtype.
    max_shard_bytes: larger exports are split into several files with an
      index, as Hugging Face does.
  """
  cfg = model.cfg
  dtype = dtype or cfg.param_dtype
  if dtype not in model_config.DTYPES:
    raise ValueError(
      f"save: dtype={dtype!r}; expected one of {model_config.DTYPES}"
    )
  np_dtype = np.dtype(jnp.dtype(dtype))
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg, dtype), f, indent=2)
  if cfg.lora is not None:
    params = lora.merged(model)
  else:
    params = nnx.to_pure_dict(nnx.state(model, lora.WEIGHTS))
  flat = traverse_util.flatten_dict(params)
  tensors: list[tuple[str, _Entry, int | None]] = []
  for entry in _layout(cfg):
    for i, name in enumerate(entry.names(cfg.num_layers)):
      tensors.append((name, entry, i if entry.stacked else None))
  nbytes = lambda e: (
    math.prod(_expected_hf_shape(e, flat[e.path].shape)) * np_dtype.itemsize
  )
  shards = _shards(tensors, nbytes, max_shard_bytes)
  names = (
    ["model.safetensors"]
    if len(shards) == 1
    else [
      f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
      for k in range(len(shards))
    ]
  )
  weight_map = {}
  for file_name, shard in zip(names, shards, strict=True):
    _write_shard(os.path.join(path, file_name), shard, flat, np_dtype)
    weight_map.update({name: file_name for name, _, _ in shard})
  if len(shards) > 1:
    total = sum(nbytes(e) for _, e, _ in tensors)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(index, f, indent=2)


def _shards(tensors: list, nbytes: Callable, max_bytes: int) -> list[list]:
  """``tensors`` in order, cut into files of at most ``max_bytes`` (a
  larger tensor alone in its file)."""
  shards: list[list] = [[]]
  size = 0
  for item in tensors:
    n = nbytes(item[1])
    if shards[-1] and size + n > max_bytes:
      shards.append([])
      size = 0
    shards[-1].append(item)
    size += n
  return shards


def _write_shard(file: str, shard: list, flat: dict, np_dtype) -> None:
  """One safetensors file of ``shard``'s tensors, streamed one by one."""
  shape = lambda e: _expected_hf_shape(e, flat[e.path].shape)
  with open(file, "wb") as f:
    f.write(header_bytes([(n, np_dtype, shape(e)) for n, e, _ in shard]))
    for _, entry, layer in shard:
      value = flat[entry.path]
      value = value if layer is None else value[layer]
      array = entry.to_hf(np.asarray(jax.device_get(value)))
      f.write(np.ascontiguousarray(array, np_dtype).tobytes())


def tensor_names(cfg: ModelConfig) -> Iterator[str]:
  """The Hugging Face tensor names a checkpoint of ``cfg`` holds."""
  for entry in _layout(cfg):
    yield from entry.names(cfg.num_layers)
