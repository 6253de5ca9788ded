"""The generalization table: policies on the environments they trained on
and on their variants, from ``python -m starpo_jax.evaluate`` outputs.

  for r in sokoban frozen_lake mixture; do
    python -m starpo_jax.evaluate --workdir=runs/$r --variants=ragen \\
      --temperatures=0.5 --out=runs/variants/$r
  done
  python -m experiments.variants_table runs/variants/* \\
    --json docs/data/eval_generalization.json

One row an environment (its registered name and settings, as each
evaluation's ``summary.json`` records them: a run's ``eval`` and a
mixture's part with the same settings are one row), one column a policy
(named by its directory): held-out success with its 95% interval, or
"-" where the policy was not evaluated there; last, the random valid
player on the same levels (every evaluation draws its levels from the
same held-out key, so it is one figure a row).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from benchmarks import common
from experiments.zero_shot_table import interval, load


def _settings(settings: dict[str, Any]) -> str:
  """An environment's settings other than its name, or "default"."""
  show = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
  rest = [f"{k}={show(v)}" for k, v in sorted(settings.items()) if k != "env"]
  return ", ".join(rest) or "default"


def rows(
  summaries: dict[str, dict[str, Any]], label: str
) -> list[dict[str, Any]]:
  """One entry an environment, in the order first evaluated: its tag, its
  settings, each policy's success at temperature ``label`` (absent where
  not evaluated) and the random valid player.

  Raises:
    ValueError: a summary without environment settings (written before
      evaluate recorded them), or one environment whose random player
      differs between evaluations (different levels).
  """
  out: dict[str, dict[str, Any]] = {}
  for name, summary in summaries.items():
    if "settings" not in summary:
      raise ValueError(
        f"variants_table: {name}'s summary.json has no environment "
        "settings; evaluate it again"
      )
    for tag, entry in summary["envs"].items():
      settings = summary["settings"][tag]
      key = json.dumps(settings, sort_keys=True)
      shown = settings["env"] if tag == "eval" else tag
      row = out.setdefault(
        key,
        dict(env=shown, settings=settings, random=entry["random_valid"], by={}),
      )
      if len(shown) < len(row["env"]):
        row["env"] = shown
      if row["random"] != entry["random_valid"]:
        raise ValueError(
          f"variants_table: {name} played {shown} on other levels than "
          f"the evaluations before it (random player {entry['random_valid']} "
          f"against {row['random']}); evaluate all with the same --episodes"
        )
      if label in entry:
        row["by"].setdefault(name, entry[label])
  return list(out.values())


def table(summaries: dict[str, dict[str, Any]], label: str = "t0.5") -> str:
  """Rows: environments; columns: policies, then the random player."""
  names = list(summaries)
  return common.markdown_table(
    ["environment", "settings", *names, "random valid player"],
    [
      [
        r["env"],
        _settings(r["settings"]),
        *(interval(r["by"][n]) if n in r["by"] else "-" for n in names),
        interval(r["random"]),
      ]
      for r in rows(summaries, label)
    ],
  )


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("outs", nargs="+", help="evaluate --out directories")
  parser.add_argument("--temperature", default="t0.5", help="e.g. t0.5, greedy")
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  summaries = {os.path.basename(o.rstrip("/")): load(o) for o in args.outs}
  print(table(summaries, args.temperature))
  common.write_json(
    args.json,
    {
      "machine": common.machine(),
      "temperature": args.temperature,
      "policies": summaries,
    },
  )
  if args.json:
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
