"""Learning curves of training runs, from their ``metrics.jsonl``.

  python -m benchmarks.plot_curves runs/sokoban runs/frozen_lake \\
    --out docs/learning_curves.png

Held-out success is drawn with its 95% interval (shaded) and the random
valid player on the same levels (dashed); a dotted vertical line marks
where a warm start ended and RL began.
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from starpo_jax import logging as log_lib

PANELS = (
  ("eval/success", "held-out success (t=0.5)"),
  ("eval/success@t0", "held-out success (greedy)"),
  ("rollout/success", "training success (10-step mean)"),
  ("rollout/valid_action_rate", "valid action rate (training)"),
)


# Training panels: the mean of the last SMOOTH steps (one step's 8 or 16
# levels make a noisy rate).
SMOOTH = 10


def _moving_mean(ys, n):
  return [
    sum(ys[max(0, i - n + 1) : i + 1]) / min(i + 1, n) for i in range(len(ys))
  ]


def _series(records, key):
  points = [(r["step"], r[key]) for r in records if key in r]
  return tuple(zip(*points, strict=True)) if points else ((), ())


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
  for workdir in args.workdirs:
    records = log_lib.read_metrics(workdir)
    label = os.path.basename(os.path.normpath(workdir))
    warm = max((r["step"] for r in records if "sft/loss" in r), default=0)
    for ax, (key, title) in zip(axes, PANELS, strict=True):
      xs, ys = _series(records, key)
      if not xs:
        continue
      held_out = key.startswith("eval/")
      if not held_out:
        ys = _moving_mean(ys, SMOOTH)
      (line,) = ax.plot(
        xs, ys, label=label, marker="o" if held_out else None, markersize=3
      )
      color = line.get_color()
      if held_out:
        stem = key.replace("/success", "/success_{}")
        _, lo = _series(records, stem.format("lo"))
        _, hi = _series(records, stem.format("hi"))
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2)
        _, rand = _series(records, "eval/random_success")
        if rand:
          ax.axhline(rand[-1], color=color, linestyle="--", linewidth=1)
      if warm:
        ax.axvline(warm, color=color, linestyle=":", linewidth=1)
      ax.set_title(title)
      ax.set_xlabel("step")
      ax.set_ylim(0, 1)
      ax.grid(alpha=0.3)
  axes[0].legend(loc="lower right")
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
