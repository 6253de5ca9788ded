"""The zero-shot table, from ``python -m starpo_jax.evaluate`` outputs.

  for e in bandit frozen_lake sokoban countdown; do
    python -m starpo_jax.evaluate --config=configs/$e.py:model=smollm2-135m \\
      --out=runs/zero-shot/$e
  done
  python -m experiments.zero_shot_table runs/zero-shot/* \\
    --json docs/data/zero_shot_smollm2.json

One column per evaluation (named by its directory), each temperature it
was played at: held-out success with its 95% interval, the share of
replies in the format, of answers naming a valid action, the reasoning
tokens a turn, and the random valid player on the same levels.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from benchmarks import common


def interval(stats: dict[str, float]) -> str:
  return (
    f"{100 * stats['success']:.1f}% [{100 * stats['success_lo']:.1f}, "
    f"{100 * stats['success_hi']:.1f}]"
  )


def load(out: str) -> dict[str, Any]:
  """One evaluation's ``summary.json``, naming the directory if absent."""
  path = os.path.join(out, "summary.json")
  if not os.path.isfile(path):
    raise SystemExit(f"zero_shot_table: {path} is missing: not an evaluation")
  with open(path) as f:
    return json.load(f)


def table(summaries: dict[str, dict[str, Any]]) -> str:
  """Rows: success, format / valid / reasoning, random valid player."""
  header, rows = [""], [[], [], []]
  labels = ("success", "in the format / valid actions / reasoning tokens")
  for name, summary in summaries.items():
    for env, entry in summary["envs"].items():
      played = [k for k in entry if k != "random_valid"]
      for label in played:
        st = entry[label]
        header.append(name if env == "eval" else f"{name} ({env})")
        rows[0].append(f"{interval(st)} ({label})")
        rows[1].append(
          f"{100 * st['format_rate']:.1f}% / "
          f"{100 * st['valid_action_rate']:.1f}% / {st['think_tokens']:.1f}"
        )
        rows[2].append(interval(entry["random_valid"]))
  names = [*labels, "random valid player, same levels"]
  return common.markdown_table(
    header, [[n, *r] for n, r in zip(names, rows, strict=True)]
  )


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("outs", nargs="+", help="evaluate --out directories")
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  summaries = {os.path.basename(o.rstrip("/")): load(o) for o in args.outs}
  print(table(summaries))
  common.write_json(
    args.json,
    {"machine": common.machine(), "commit": common.commit(), **summaries},
  )
  if args.json:
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
