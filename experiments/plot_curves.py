"""Learning curves of training runs side by side in one figure (the
README's), from their ``metrics.jsonl``.

  python -m experiments.plot_curves runs/sokoban runs/frozen_lake \\
    --out docs/learning_curves.png

Held-out success is drawn with its 95% interval (shaded) and the random
valid player on the same levels (dashed); a dotted vertical line marks
where a warm start ended and RL began. ``python -m starpo_jax.report``
draws the same panels and more, one file each, with an HTML page.
"""

from __future__ import annotations

import argparse
import os

from starpo_jax.cli import report

PANELS = (
  report.Panel(
    "eval_success",
    "held-out success (t=0.5)",
    "eval/success",
    held_out=True,
    reference="eval/random_success",
    unit_range=True,
  ),
  report.Panel(
    "eval_success_greedy",
    "held-out success (greedy)",
    "eval/success@t0",
    held_out=True,
    reference="eval/random_success",
    unit_range=True,
  ),
  report.Panel(
    "success",
    f"training success ({report.SMOOTH}-step mean)",
    "rollout/success",
    unit_range=True,
  ),
  report.Panel(
    "valid",
    "valid action rate (training)",
    "rollout/valid_action_rate",
    unit_range=True,
  ),
)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  plt = report.pyplot()
  runs = [report.load_run(w) for w in args.workdirs]
  fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
  for ax, panel in zip(axes, PANELS, strict=True):
    report.draw(ax, panel, runs)
  fig.text(
    0.5,
    0.01,
    "shaded: 95% interval; dashed: random valid player on the same levels; "
    "dotted: warm start ends, RL begins",
    ha="center",
    fontsize=8,
  )
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
