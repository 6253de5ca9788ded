"""Do Tunix's Qwen2 and ours compute the same function? The tiny
iteration workload's policy is written with ``hf.save``; Tunix's own
loader reads it in Tunix's environment (``logits.py``, a subprocess) and
both give logits for the same tokens; the largest difference is printed
and must be under 1e-4.

  python -m benchmarks.compare.tunix.check
  python -m benchmarks.compare.tunix.check --perturb   # must fail

Tunix's Python is ``$TUNIX_PYTHON``, else the environment made as
``requirements.txt`` says (``benchmarks/compare/tunix/.venv``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 1e-4


def python() -> str:
  """The interpreter of Tunix's environment."""
  return os.environ.get(
    "TUNIX_PYTHON", os.path.join(HERE, ".venv", "bin", "python")
  )


def perturbed_copy(ckpt: str, out: str) -> None:
  """``ckpt`` copied to ``out`` with its final norm's first entry moved
  by 0.05 (what a wrong mapping of one tensor would look like)."""
  from safetensors.numpy import load_file, save_file

  shutil.copytree(ckpt, out)
  tensors = load_file(os.path.join(ckpt, "model.safetensors"))
  scale = tensors["model.norm.weight"].copy()
  scale[0] += 0.05
  tensors["model.norm.weight"] = scale
  save_file(tensors, os.path.join(out, "model.safetensors"))


def logit_gap(workdir: str, perturb: bool = False, seed: int = 0) -> float:
  """Largest ``|our logit - Tunix's logit|`` over random tokens ``[4, 96]``
  of the tiny workload's vocabulary (Tunix reading a perturbed copy of the
  checkpoint with ``perturb``)."""
  import jax.numpy as jnp
  from flax import nnx

  from benchmarks.compare import workload

  pair = workload.Pair("tiny", "cpu", workdir)
  pair.init_jax()
  model = nnx.merge(pair.policy_def, pair.state.policy)
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, pair.model_cfg.vocab_size, (4, 96), np.int32)
  hidden, _ = model.hidden(jnp.asarray(tokens))
  ours = np.asarray(model.logits(hidden), np.float32)
  ckpt = pair.model_dir
  if perturb:
    ckpt = os.path.join(workdir, "perturbed")
    perturbed_copy(pair.model_dir, ckpt)
  np.save(os.path.join(workdir, "tokens.npy"), tokens)
  out = os.path.join(workdir, "tunix_logits.npy")
  subprocess.run(
    [
      python(),
      os.path.join(HERE, "logits.py"),
      ckpt,
      os.path.join(workdir, "tokens.npy"),
      out,
    ],
    check=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  theirs = np.load(out)
  if theirs.shape != ours.shape:
    raise RuntimeError(f"Tunix gave {theirs.shape}, ours {ours.shape}")
  return float(np.abs(ours - theirs).max())


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--perturb", action="store_true")
  args = parser.parse_args(argv)
  if not os.path.exists(python()):
    print(f"no Tunix environment at {python()}: see {HERE}/requirements.txt")
    return 2
  with tempfile.TemporaryDirectory() as workdir:
    gap = logit_gap(workdir, args.perturb)
  ok = gap < TOLERANCE
  print(
    f"largest logit difference, starpo-jax vs Tunix Qwen2: {gap:.2e} "
    f"({'within' if ok else 'OVER'} {TOLERANCE:g})"
  )
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
