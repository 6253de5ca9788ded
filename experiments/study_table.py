"""The README's collapse-study table, from the runs of experiments/study.sh.

  python -m experiments.study_table runs/study/frozen_lake-starpo \\
    runs/study/frozen_lake-starpo_s runs/study/frozen_lake-grpo \\
    --json docs/data/study_frozen_lake.json

One column per run: held-out success at every evaluation and at the end
(with its 95% interval) beside the random valid player, then training
success, valid actions, entropy, the in-group reward spread and the
collapse diagnostics over the first and last ``WINDOW`` steps (the
diagnostics at their first and last computation).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from benchmarks import common
from starpo_jax.cli import report

WINDOW = 10


def _mean(values: list[float]) -> float:
  return sum(values) / len(values)


def column(run: report.Run) -> dict[str, str]:
  """The cells of one run."""
  rs = run.records
  steps, success = report.series(rs, "eval/success")
  cells = {}
  if success:
    final = next(r for r in reversed(rs) if "eval/success" in r)
    cells["held-out success by step"] = (
      " / ".join(f"{100 * s:.1f}" for s in success)
      + f" (steps {', '.join(map(str, steps))})"
    )
    cells["final held-out success"] = (
      f"{100 * final['eval/success']:.1f}% "
      f"[{100 * final['eval/success_lo']:.1f}, "
      f"{100 * final['eval/success_hi']:.1f}]"
    )
    cells["random valid player"] = f"{100 * final['eval/random_success']:.1f}%"

  def first_last(key: str, label: str, scale: float = 1.0, fmt=".2f"):
    _, ys = report.series(rs, key)
    if not ys:
      return
    a, b = _mean(ys[:WINDOW]), _mean(ys[-WINDOW:])
    cells[label] = f"{scale * a:{fmt}} / {scale * b:{fmt}}"

  def at_ends(key: str, label: str, fmt=".3f"):
    _, ys = report.series(rs, key)
    if ys:
      cells[label] = f"{ys[0]:{fmt}} / {ys[-1]:{fmt}}"

  first_last(
    "rollout/success", "training success %, first / last 10", 100, ".1f"
  )
  first_last(
    "rollout/valid_action_rate", "valid actions %, first / last 10", 100, ".1f"
  )
  first_last("rollout/entropy", "entropy per token, first / last 10")
  first_last(
    "rollout/in_group_reward_std", "in-group reward std, first / last 10"
  )
  first_last(
    "rollout/response_length", "reply tokens, first / last 10", 1, ".1f"
  )
  at_ends("collapse/mi", "MI(prompt; reply) nats, first / last")
  _, bound = report.series(rs, "collapse/mi_bound")
  if bound:
    cells["MI bound log G"] = f"{bound[-1]:.3f}"
  at_ends("collapse/retrieval@1", "retrieval@1, first / last", ".2f")
  _, chance = report.series(rs, "collapse/retrieval_chance@1")
  if chance:
    cells["retrieval chance@1"] = f"{chance[-1]:.3f}"
  at_ends("grads/task", "task gradient norm, first / last")
  at_ends("grads/entropy", "entropy-term gradient norm, first / last", ".4f")
  _, elapsed = report.series(rs, "time/elapsed_s")
  cells["wall time"] = f"{elapsed[-1] / 60:.1f} min"
  return cells


def table(columns: list[dict[str, Any]]) -> str:
  """The markdown table of ``columns`` (each a run's label and cells)."""
  rows = list(dict.fromkeys(k for c in columns for k in c["cells"]))
  out = [
    "| | " + " | ".join(c["label"] for c in columns) + " |",
    "|---|" + "---|" * len(columns),
  ]
  out += [
    f"| {row} | " + " | ".join(c["cells"].get(row, "-") for c in columns) + " |"
    for row in rows
  ]
  return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--json", default=None, help="write the columns here")
  args = parser.parse_args(argv)
  runs = [
    report.load_run(w, os.path.basename(os.path.normpath(w)))
    for w in args.workdirs
  ]
  columns = [{"label": r.label, "cells": column(r)} for r in runs]
  print(table(columns))
  common.write_json(
    args.json, {"machine": common.machine(), "columns": columns}
  )
  return {"columns": columns}


if __name__ == "__main__":
  main()
