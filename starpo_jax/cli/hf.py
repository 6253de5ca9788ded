"""``python -m starpo_jax.hf``: Hugging Face checkpoints from the command
line.

  python -m starpo_jax.hf verify PATH        # logits against transformers
  python -m starpo_jax.hf export RUN OUT     # a run's policy, then verify it

``export`` writes the policy of a run's checkpoint as a Hugging Face
directory with its tokenizer, a LoRA run's adapters folded into its
weights, and checks its logits against ``transformers``.
"""

from __future__ import annotations

import argparse
import sys

from flax import nnx

from starpo_jax.models import hf, transformer
from starpo_jax.run import assembly


def export(
  workdir: str, out: str, step: int | None = None, dtype: str | None = None
) -> str:
  """Writes the policy of a run's checkpoint at ``step`` (default: the
  latest) as a Hugging Face directory ``out``, with its tokenizer; a LoRA
  run's adapters folded into its base's weights. Returns ``out``.

  Raises:
    assembly.ConfigError: no run or checkpoint there, or adapters
      whose base is not the one the run's config gives.
  """

  setup = assembly.build(assembly.load_config(workdir))
  _, policy = assembly.load_policy(setup, workdir, step, what="workdir")
  model = nnx.merge(assembly.make_learner(setup).policy_def, policy)
  hf.save(model, out, dtype=dtype)
  setup.tokenizer.save(out)
  return out


def main(argv: list[str] | None = None) -> int:

  parser = argparse.ArgumentParser(prog="python -m starpo_jax.hf")
  sub = parser.add_subparsers(dest="command", required=True)
  prompt = argparse.ArgumentParser(add_help=False)
  prompt.add_argument(
    "--prompt",
    default="You are solving the Sokoban puzzle.",
    help="the text whose logits are compared with transformers'",
  )
  v = sub.add_parser(
    "verify", parents=[prompt], help="compare logits with transformers"
  )
  v.add_argument("path")
  e = sub.add_parser(
    "export",
    parents=[prompt],
    help="write a run's policy as a Hugging Face checkpoint, then verify it",
  )
  e.add_argument("workdir", help="the run's directory")
  e.add_argument("out", help="the directory to write")
  e.add_argument("--step", type=int, help="default: the latest checkpoint")
  e.add_argument("--dtype", choices=transformer.DTYPES)
  args = parser.parse_args(argv)
  try:
    if args.command == "export":
      print(f"wrote {export(args.workdir, args.out, args.step, args.dtype)}")
      args.path = args.out
    report = hf.verify(args.path, args.prompt)
  except (hf.CheckpointError, assembly.ConfigError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for key, value in report.items():
    print(f"{key}: {value}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
