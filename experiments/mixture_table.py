"""A mixture run's parts beside their own single-environment runs, at the
same number of their own RL episodes, from the runs' ``metrics.jsonl``.

  python -m experiments.mixture_table runs/mixture runs/mixture_by_part \\
    --own sokoban=runs/sokoban --own frozen_lake=runs/frozen_lake \\
    --json docs/data/learning_mixture.json

For each part of each mixture run (a column: the run's directory and the
part's tag), beside the own run of the part's environment: the
mixture's held-out success after its warm start and at its last
evaluation, the part's RL episodes by then (RL steps x the part's groups
x group size), the own run at the evaluation where its RL episodes were
the same (that run's RL steps x its batch; its warm start is its own),
the difference, the own run's final success, the random valid player on
the same levels, and over the mixture's RL steps the share of the part's
groups the filter kept and their in-group reward spread. Success is at
t=0.5 with its 95% interval.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from benchmarks import common
from starpo_jax.run import metrics as metrics_lib


def _config(workdir: str) -> dict[str, Any]:
  with open(os.path.join(workdir, "config.json")) as f:
    return json.load(f)


def _at(records: list[dict], step: int, name: str) -> dict[str, float]:
  """Held-out success ``name/...`` at ``step``, as success / lo / hi."""
  for r in records:
    if r["step"] == step and f"{name}/success" in r:
      return {k: r[f"{name}/success{s}"] for k, s in _STATS}
  raise ValueError(f"mixture_table: no {name}/success at step {step}")


_STATS = (("success", ""), ("success_lo", "_lo"), ("success_hi", "_hi"))


def part(mixed: str, tag: str, own: str) -> dict[str, Any]:
  """Part ``tag`` of mixture run ``mixed`` beside run ``own``.

  Raises:
    ValueError: no evaluation of ``own`` at the matching number of RL
      episodes, naming the steps it has.
  """
  mc, oc = _config(mixed), _config(own)
  records, own_records = (metrics_lib.read_metrics(w) for w in (mixed, own))
  per_step = mc["env"]["mixture"][tag]["groups"] * mc["rollout"]["group_size"]
  warm, own_warm = mc["sft"]["steps"], oc["sft"]["steps"]
  final = max(r["step"] for r in records if f"{tag}/success" in r)
  episodes = (final - warm) * per_step
  own_batch = oc["rollout"]["env_groups"] * oc["rollout"]["group_size"]
  steps, left = divmod(episodes, own_batch)
  evaluated = [r["step"] for r in own_records if "eval/success" in r]
  if left or own_warm + steps not in evaluated:
    raise ValueError(
      f"mixture_table: {tag}: {episodes} RL episodes are not an evaluated "
      f"step of {own} ({own_batch} episodes a step after {own_warm} warm-"
      f"start steps; evaluated at {evaluated})"
    )
  last = next(r for r in records if f"{tag}/random_success" in r)
  mean = lambda k: float(np.mean([r[k] for r in records if k in r]))
  return dict(
    tag=tag,
    mixture=mixed,
    own=own,
    episodes=episodes,
    rl_steps=final - warm,
    episodes_per_step=per_step,
    own_step=own_warm + steps,
    own_episodes_per_step=own_batch,
    start=_at(records, warm, tag),
    final=_at(records, final, tag),
    own_start=_at(own_records, own_warm, "eval"),
    own_matched=_at(own_records, own_warm + steps, "eval"),
    own_final=_at(own_records, max(evaluated), "eval"),
    random={k: last[f"{tag}/random_success{s}"] for k, s in _STATS},
    kept=mean(f"filter/{tag}/kept_ratio"),
    spread=mean(f"rollout/{tag}/in_group_reward_std"),
  )


def _interval(s: dict[str, float]) -> str:
  return (
    f"{100 * s['success']:.1f}% [{100 * s['success_lo']:.1f}, "
    f"{100 * s['success_hi']:.1f}]"
  )


def table(parts: list[dict[str, Any]]) -> str:
  """One column a part; rows as the module says."""
  rows = [
    (
      "RL episodes of its own (steps x episodes)",
      lambda p: f"{p['episodes']} ({p['rl_steps']} x {p['episodes_per_step']})",
    ),
    ("mixture, after its warm start", lambda p: _interval(p["start"])),
    ("mixture, final", lambda p: _interval(p["final"])),
    ("own run, after its warm start", lambda p: _interval(p["own_start"])),
    (
      "own run, same RL episodes",
      lambda p: f"{_interval(p['own_matched'])} (step {p['own_step']})",
    ),
    (
      "mixture - own run, same RL episodes",
      lambda p: (
        f"{100 * (p['final']['success'] - p['own_matched']['success']):+.1f} "
        "points"
      ),
    ),
    ("own run, final", lambda p: _interval(p["own_final"])),
    ("random valid player, same levels", lambda p: _interval(p["random"])),
    (
      "its groups the filter kept, mean over RL",
      lambda p: f"{100 * p['kept']:.1f}%",
    ),
    ("in-group reward std, mean over RL", lambda p: f"{p['spread']:.2f}"),
  ]
  name = lambda p: f"{os.path.basename(p['mixture'].rstrip('/'))}: {p['tag']}"
  return common.markdown_table(
    ["", *(name(p) for p in parts)],
    [[label, *(cell(p) for p in parts)] for label, cell in rows],
  )


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("mixtures", nargs="+", help="mixture runs' workdirs")
  parser.add_argument(
    "--own",
    action="append",
    default=[],
    help="ENV=WORKDIR: the own run of each environment the parts play",
  )
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  own = {}
  for item in args.own:
    env, sep, workdir = item.partition("=")
    if not sep:
      raise SystemExit(f"mixture_table: --own {item!r}: expected ENV=WORKDIR")
    own[env] = workdir
  parts = []
  for mixed in args.mixtures:
    for tag, entry in _config(mixed)["env"]["mixture"].items():
      if entry["env"] not in own:
        raise SystemExit(
          f"mixture_table: {mixed} plays {entry['env']} ({tag}); give its "
          f"own run with --own {entry['env']}=WORKDIR"
        )
      parts.append(part(mixed, tag, own[entry["env"]]))
  print(table(parts))
  common.write_json(args.json, {"machine": common.machine(), "parts": parts})
  if args.json:
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
