"""``python -m starpo_jax.hf``: checkpoints from the command line.

  python -m starpo_jax.hf verify PATH        # against transformers
  python -m starpo_jax.hf verify smollm2-135m
  python -m starpo_jax.hf export RUN OUT     # a run's policy, then verify it
  python -m starpo_jax.hf export smollm2-135m OUT

``verify`` reads a Hugging Face directory, a GGUF file or a packaged
preset's file (``models/checkpoints.py``) here and in ``transformers``
and compares logits, token ids and greedy tokens (``cli/verify.py``); it
exits 1 when they differ beyond tolerance. ``export`` writes the policy
of a run's checkpoint (a LoRA run's adapters folded into its weights),
or a GGUF checkpoint's weights, as a Hugging Face directory with its
tokenizer, then verifies it.
"""

from __future__ import annotations

import argparse
import os
import sys

from flax import nnx

from starpo_jax import settings
from starpo_jax.cli import app as cli_app
from starpo_jax.cli import verify as verify_lib
from starpo_jax.models import checkpoints, gguf, hf
from starpo_jax.models import config as model_config
from starpo_jax.run import assembly


def export(
  source: str, out: str, step: int | None = None, dtype: str | None = None
) -> str:
  """Writes ``source`` as a Hugging Face directory ``out`` with its
  tokenizer and returns ``out``. ``source`` is a run's directory (its
  policy at ``step``, default the latest; a LoRA run's adapters folded
  into its base's weights), a GGUF file or a packaged preset's name.

  Raises:
    assembly.ConfigError: no run or checkpoint there, or adapters
      whose base is not the one the run's config gives.
    hf.CheckpointError: a GGUF file that cannot be read.
  """
  path = checkpoints.resolve(source)
  if gguf.is_gguf(path):
    model, tok = checkpoints.load(path), checkpoints.tokenizer(path)
  else:
    setup = assembly.build(assembly.load_config(source))
    _, policy = assembly.load_policy(setup, source, step, what="workdir")
    model = nnx.merge(assembly.make_learner(setup).policy_def, policy)
    tok = setup.tokenizer
  hf.save(model, out, dtype=dtype)
  tok.save(out)
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m starpo_jax.hf")
  sub = parser.add_subparsers(dest="command", required=True)
  v = sub.add_parser("verify", help="compare with transformers")
  v.add_argument(
    "path",
    help="a Hugging Face directory, a .gguf file or a packaged preset "
    f"({', '.join(checkpoints.PACKAGED)})",
  )
  e = sub.add_parser(
    "export",
    help="write a run's policy or a GGUF checkpoint as a Hugging Face "
    "directory, then verify it",
  )
  e.add_argument(
    "source", help="a run's directory, a .gguf file or a packaged preset"
  )
  e.add_argument("out", help="the directory to write")
  e.add_argument("--step", type=int, help="default: the latest checkpoint")
  e.add_argument("--dtype", choices=model_config.DTYPES)
  args = parser.parse_args(argv)
  given = args.source if args.command == "export" else args.path
  if not os.path.exists(given) and given not in checkpoints.PACKAGED:
    parser.error(
      f"{given}: no such file or directory, nor a packaged preset"
      + settings.nearest(given, checkpoints.PACKAGED)
    )
  try:
    if args.command == "export":
      print(f"wrote {export(args.source, args.out, args.step, args.dtype)}")
      args.path = args.out
    print(f"verifying {args.path} against transformers", flush=True)
    report = verify_lib.verify(args.path)
  except assembly.ConfigError as e:  # a setting on the command line
    print(f"error: {e}", file=sys.stderr)
    return cli_app.USAGE_STATUS
  except hf.CheckpointError as e:  # a file that cannot be read
    print(f"error: {e}", file=sys.stderr)
    return 1
  for key, value in report.items():
    print(f"{key}: {value}")
  if not report["ok"]:
    print(
      f"error: {args.path} differs from transformers' reading of it "
      f"(logit tolerance {verify_lib.LOGIT_TOLERANCE:g}; token ids and "
      "greedy tokens must be identical)",
      file=sys.stderr,
    )
    return 1
  return 0


def entry() -> None:
  """``starpo-hf`` and ``python -m starpo_jax.hf``."""
  cli_app.quiet_libtpu()
  sys.exit(main())


if __name__ == "__main__":
  entry()
