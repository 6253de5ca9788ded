"""Safetensors files, read memory-mapped and written streaming, with no
code run from them (``.bin`` checkpoints are refused): the tensors of a
Hugging Face model directory, one file or sharded with an index."""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded; the message names the file or
  tensor."""


class SafetensorsFile:
  """A memory-mapped safetensors file, checked against its own header."""

  def __init__(self, path: str) -> None:
    self.path = path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise CheckpointError(f"{path}: truncated: no safetensors header")
      (n,) = struct.unpack("<Q", head)
      if 8 + n > size:
        raise CheckpointError(
          f"{path}: truncated: its header needs {8 + n} bytes, the file has "
          f"{size}"
        )
      try:
        header = json.loads(f.read(n))
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable header: {e}") from None
    header.pop("__metadata__", None)
    data = size - 8 - n
    self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
    for name, info in header.items():
      if info.get("dtype") not in _DTYPES:
        raise CheckpointError(
          f"{path}: tensor {name} has unsupported dtype {info.get('dtype')}"
        )
      dtype = _DTYPES[info["dtype"]]
      shape = tuple(info["shape"])
      start, end = info["data_offsets"]
      if end - start != math.prod(shape) * dtype.itemsize:
        raise CheckpointError(
          f"{path}: tensor {name} has {end - start} bytes for shape {shape}"
        )
      if end > data:
        raise CheckpointError(
          f"{path}: truncated: tensor {name} ends at data byte {end} but the "
          f"file holds {data}"
        )
      self.entries[name] = (dtype, shape, start, end)
    self._data = (
      np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n, shape=(data,))
      if data
      else np.zeros(0, np.uint8)
    )

  def shape(self, name: str) -> tuple[int, ...]:
    return self.entries[name][1]

  def get(self, name: str) -> np.ndarray:
    """The tensor as a read-only view of the mapped file (no copy)."""
    dtype, shape, start, end = self.entries[name]
    return self._data[start:end].view(dtype).reshape(shape)


def open_tensors(path: str) -> dict[str, SafetensorsFile]:
  """Tensor name -> the file holding it, for a model directory."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index}: no weight_map")
    files: dict[str, SafetensorsFile] = {}
    for name in sorted(set(weight_map.values())):
      file = os.path.join(path, name)
      if not os.path.isfile(file):
        raise CheckpointError(f"{file}: missing (listed in {index})")
      files[name] = SafetensorsFile(file)
    out = {}
    for tensor, name in weight_map.items():
      if tensor not in files[name].entries:
        raise CheckpointError(
          f"{files[name].path}: tensor {tensor} is missing (listed in {index})"
        )
      out[tensor] = files[name]
    return out
  names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
  if not names:
    pickled = [n for n in os.listdir(path) if n.endswith((".bin", ".pt"))]
    hint = " (pickled checkpoints are never loaded: they can run code)"
    raise CheckpointError(
      f"{path}: no *.safetensors file{hint if pickled else ''}"
    )
  out = {}
  for name in names:
    file = SafetensorsFile(os.path.join(path, name))
    for tensor in file.entries:
      out[tensor] = file
  return out


def header_bytes(entries: list[tuple[str, np.dtype, tuple[int, ...]]]) -> bytes:
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, dtype, shape in entries:
    size = math.prod(shape) * dtype.itemsize
    header[name] = {
      "dtype": _DTYPE_NAMES[dtype],
      "shape": list(shape),
      "data_offsets": [offset, offset + size],
    }
    offset += size
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return struct.pack("<Q", len(raw)) + raw
