"""Learning curves of training runs, from their ``metrics.jsonl``.

  python -m benchmarks.plot_curves runs/sokoban runs/frozen_lake \\
    --out docs/learning_curves.png
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from starpo_jax import logging as log_lib

PANELS = (
  ("rollout/success", "training success"),
  ("eval/success", "held-out success (t=0.5)"),
  ("rollout/return", "training return"),
  ("rollout/valid_action_rate", "valid action rate"),
)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
  for workdir in args.workdirs:
    records = log_lib.read_metrics(workdir)
    label = os.path.basename(os.path.normpath(workdir))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
      points = [(r["step"], r[key]) for r in records if key in r]
      if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(
          xs,
          ys,
          label=label,
          marker="o" if key.startswith("eval") else None,
          markersize=3,
        )
      ax.set_title(title)
      ax.set_xlabel("step")
      ax.grid(alpha=0.3)
  axes[0].legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
