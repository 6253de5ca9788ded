"""A mixture's parts against their own runs over several seeds, from the
JSON files ``experiments.mixture_table`` writes (one a seed).

  python -m experiments.mixture_seeds docs/data/learning_mixture.json \\
    docs/data/learning_mixture_seed1.json \\
    docs/data/learning_mixture_seed2.json \\
    --json docs/data/learning_mixture_seeds.json

A row for each mixture setting and part: the part's held-out success at
its last evaluation minus its own run's at the same number of its own RL
episodes (``mixture_table``'s difference), seed by seed; their mean with
a 95% Student-t interval over the seeds, their standard deviation, how
many seeds are within ``--limit`` points (and how many no more than
``--limit`` below: a part ahead of its own run by more is within it
only in the second count), the mean difference after the two warm
starts (where RL began; the mixture's imitates each part on its share of
the episodes), and the own run's final
success seed by seed (how far a seed alone moves a run). A setting is
its run directory's name without the ``_seed<N>`` suffix the commands of
docs/results.md give it (no suffix: seed 0), so ``mixture_by_part`` and
``mixture_by_part_seed1`` are one setting at seeds 0 and 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

import numpy as np
import scipy.stats

from benchmarks import common

_SEEDED = re.compile(r"(?P<setting>.+?)(?:_seed(?P<seed>\d+))?")


def setting_and_seed(run: str) -> tuple[str, int]:
  """``runs/mixture_by_part_seed2`` -> ``("mixture_by_part", 2)``."""
  m = _SEEDED.fullmatch(os.path.basename(run.rstrip("/")))
  return m["setting"], int(m["seed"] or 0)


def rows(tables: list[dict[str, Any]], limit: float) -> list[dict[str, Any]]:
  """One row a (setting, part) over the ``mixture_table`` JSONs given.

  Raises:
    ValueError: one setting's part twice at one seed.
  """
  found: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
  for t in tables:
    for p in t["parts"]:
      setting, seed = setting_and_seed(p["mixture"])
      seeds = found.setdefault((setting, p["tag"]), {})
      if seed in seeds:
        raise ValueError(
          f"mixture_seeds: {setting}: {p['tag']} twice at seed {seed}"
        )
      seeds[seed] = p
  out = []
  for (setting, tag), by_seed in found.items():
    seeds = sorted(by_seed)
    diff = [
      by_seed[s]["final"]["success"] - by_seed[s]["own_matched"]["success"]
      for s in seeds
    ]
    mean = float(np.mean(diff))
    sd = float(np.std(diff, ddof=1)) if len(diff) > 1 else float("nan")
    half = (
      float(scipy.stats.t.ppf(0.975, len(diff) - 1) * sd / np.sqrt(len(diff)))
      if len(diff) > 1
      else float("nan")
    )
    out.append(
      dict(
        setting=setting,
        tag=tag,
        seeds=seeds,
        differences=diff,
        mean=mean,
        sd=sd,
        lo=mean - half,
        hi=mean + half,
        within=sum(abs(d) <= limit for d in diff),
        not_below=sum(d >= -limit for d in diff),
        own_final=[by_seed[s]["own_final"]["success"] for s in seeds],
        start_differences=[
          by_seed[s]["start"]["success"] - by_seed[s]["own_start"]["success"]
          for s in seeds
        ],
      )
    )
  return out


def _points(x: float) -> str:
  return f"{100 * x:+.1f}"


def table(rows: list[dict[str, Any]], limit: float) -> str:
  """The rows as the module says, differences in points."""
  lines = []
  for r in rows:
    interval = (
      f"{_points(r['mean'])} [{_points(r['lo'])}, {_points(r['hi'])}]"
      if len(r["seeds"]) > 1
      else _points(r["mean"])
    )
    lines.append(
      [
        f"{r['setting']}: {r['tag']}",
        ", ".join(map(str, r["seeds"])),
        ", ".join(_points(d) for d in r["differences"]),
        interval,
        f"{100 * r['sd']:.1f}" if len(r["seeds"]) > 1 else "-",
        f"{r['within']} of {len(r['seeds'])}",
        f"{r['not_below']} of {len(r['seeds'])}",
        _points(float(np.mean(r["start_differences"]))),
        ", ".join(f"{100 * s:.1f}%" for s in r["own_final"]),
      ]
    )
  return common.markdown_table(
    [
      "mixture: part",
      "seeds",
      "mixture - own run, same RL episodes (points, by seed)",
      "mean [95% interval]",
      "sd",
      f"seeds within {100 * limit:.0f} points",
      f"seeds no more than {100 * limit:.0f} points below",
      "after the warm starts, mean",
      "own run, final (by seed)",
    ],
    lines,
  )


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("tables", nargs="+", help="mixture_table JSON files")
  parser.add_argument(
    "--limit", type=float, default=10.0, help="points a part is held to"
  )
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  tables = []
  for path in args.tables:
    with open(path) as f:
      tables.append(json.load(f))
  limit = args.limit / 100
  out = rows(tables, limit)
  print(table(out, limit))
  sources = [
    dict(file=p, commit=t["commit"], cpu=t["machine"]["cpu"])
    for p, t in zip(args.tables, tables, strict=True)
  ]
  common.write_json(
    args.json, {"limit": limit, "rows": out, "sources": sources}
  )
  if args.json:
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
