"""The README's learning table, from training runs' ``metrics.jsonl``.

  python -m experiments.learning_table runs/sokoban runs/frozen_lake
  python -m experiments.learning_table runs/sokoban --json docs/data/learn.json

For each run: held-out success (with its 95% interval) untrained, where RL
started (after the warm start, if any), at the end and at its best, RL's
own gain, the random valid player on the same levels, training rates over
the first and last ten RL steps, and the wall time since the run started
(compiles and evaluations included; for a resumed run, the sum over its
processes, each start counted).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from typing import Any

import numpy as np

from benchmarks import common
from starpo_jax.run import metrics as metrics_lib


def _pct(x: float) -> str:
  return f"{100 * x:.1f}%"


def _eval(record: dict[str, Any], at: str = "") -> str:
  get = lambda stat: record[f"eval/{stat}{at}"]
  if f"eval/success{at}" not in record:
    return "-"
  return (
    f"{_pct(get('success'))} [{100 * get('success_lo'):.1f}, "
    f"{100 * get('success_hi'):.1f}]"
  )


def summarize(workdir: str, evaluation: str = "eval") -> dict[str, Any]:
  """The numbers of one run (evaluation rows empty where it ran none),
  from the evaluation logged under ``evaluation/`` (``eval_train_env``:
  the Bandit's held-out seeds with its training arm names)."""
  records = metrics_lib.read_metrics(workdir)
  if evaluation != "eval":
    records = [_as_eval(r, evaluation) for r in records]
  evals = [r for r in records if "eval/success" in r]
  warm = [r["step"] for r in records if "sft/loss" in r]
  boundary = max(warm, default=0)
  start = next((r for r in evals if r["step"] == boundary), {})
  final = evals[-1] if evals else {}
  rl = [r for r in records if "rollout/success" in r]
  diagnosed = [r for r in records if "collapse/mi" in r]
  # A resumed run restarts the clock: add up each process's wall time.
  clock = [r["time/elapsed_s"] for r in records if "time/elapsed_s" in r]
  ends = [a for a, b in itertools.pairwise(clock) if b < a]
  logged = lambda k: [r for r in rl if k in r]
  mean = lambda rs, k: float(np.mean([r[k] for r in rs])) if rs else np.nan
  early_late = lambda k: (mean(logged(k)[:10], k), mean(logged(k)[-10:], k))
  gain = lambda at: (
    final[f"eval/success{at}"] - start[f"eval/success{at}"]
    if f"eval/success{at}" in final and f"eval/success{at}" in start
    else np.nan
  )
  return {
    "workdir": workdir,
    "warm_start_steps": boundary,
    "rl_steps": max((r["step"] for r in records), default=0) - boundary,
    "minutes": (sum(ends) + clock[-1]) / 60 if clock else np.nan,
    "processes": len(ends) + 1,
    "untrained": evals[0] if evals else {},
    "start": start,
    "final": final,
    "best": max(evals, key=lambda r: r["eval/success"]) if evals else {},
    "gain": gain(""),
    "gain_greedy": gain("@t0"),
    "train_success": early_late("rollout/success"),
    "valid": early_late("rollout/valid_action_rate"),
    "entropy": early_late("rollout/entropy"),
    "train_format": early_late("rollout/format_rate"),
    "train_think": early_late("rollout/think_tokens"),
    "mi": [(r["step"], r["collapse/mi"]) for r in diagnosed],
    "expert_kept": mean([r for r in records if "sft/kept" in r], "sft/kept"),
  }


def _as_eval(record: dict[str, Any], evaluation: str) -> dict[str, Any]:
  """``record`` with ``evaluation/`` metrics named ``eval/`` (the
  ``eval/`` ones dropped)."""
  return {
    k.replace(f"{evaluation}/", "eval/", 1): v
    for k, v in record.items()
    if not k.startswith("eval/")
  }


# The table's rows: a label and how a run's summary fills its cell.
ROWS = [
  (
    "steps (warm start + RL)",
    lambda s: f"{s['warm_start_steps']} + {s['rl_steps']}",
  ),
  (
    "wall time, compiles and evaluations included",
    lambda s: (
      f"{s['minutes']:.1f} min"
      + (f" ({s['processes']} processes)" if s["processes"] > 1 else "")
    ),
  ),
  (
    "warm start: levels its expert solved, mean a step",
    lambda s: (
      "-" if np.isnan(s.get("expert_kept", np.nan)) else _pct(s["expert_kept"])
    ),
  ),
  ("held-out success, untrained (t=0.5)", lambda s: _eval(s["untrained"])),
  ("after the warm start (t=0.5)", lambda s: _eval(s["start"])),
  ("final (t=0.5)", lambda s: _eval(s["final"])),
  ("final, greedy", lambda s: _eval(s["final"], "@t0")),
  (
    "best of the evaluations (t=0.5)",
    lambda s: (
      f"{_pct(s['best']['eval/success'])} (step {s['best']['step']})"
      if s["best"]
      else "-"
    ),
  ),
  (
    "RL's gain over its start, t=0.5 / greedy",
    lambda s: f"{_points(s['gain'])} / {_points(s['gain_greedy'])} points",
  ),
  (
    "held-out answers in the format, untrained / warm start / final",
    lambda s: _three(s, "eval/format_rate", _pct),
  ),
  (
    "held-out reasoning tokens a well-formed turn, same three",
    lambda s: _three(s, "eval/think_tokens", lambda x: f"{x:.1f}"),
  ),
  ("random valid player, same levels", lambda s: _random(s["final"])),
  (
    "held-out actions an episode (a turn), final",
    lambda s: _per_turn(s["final"]),
  ),
  (
    "held-out actions that changed the state, final",
    lambda s: _final(s, "eval/effective_action_rate", _pct),
  ),
  (
    "retrieval@1 at the end (chance)",
    lambda s: (
      _final(s, "collapse/retrieval@1", lambda x: f"{x:.2f}")
      + _final(s, "collapse/retrieval_chance@1", lambda x: f" ({x:.3f})", "")
    ),
  ),
  (
    "training success, first / last 10 RL steps",
    lambda s: _pair(s["train_success"]),
  ),
  (
    "valid action rate, first / last 10 RL steps",
    lambda s: _pair(s["valid"]),
  ),
  (
    "policy entropy, first / last 10 RL steps",
    lambda s: " / ".join(
      "-" if np.isnan(x) else f"{x:.2f}" for x in s["entropy"]
    ),
  ),
  (
    "answers in the format, first / last 10 RL steps",
    lambda s: _pair(s["train_format"]),
  ),
  (
    "reasoning tokens a well-formed turn, first / last 10 RL steps",
    lambda s: " / ".join(
      "-" if np.isnan(x) else f"{x:.1f}" for x in s["train_think"]
    ),
  ),
  (
    "collapse MI, nats (step)",
    lambda s: ", ".join(f"{m:.2f} ({k})" for k, m in _spread(s["mi"])) or "-",
  ),
]


# The rows a summary (the README's) shows.
BRIEF = (
  "steps (warm start + RL)",
  "wall time, compiles and evaluations included",
  "held-out success, untrained (t=0.5)",
  "after the warm start (t=0.5)",
  "final (t=0.5)",
  "random valid player, same levels",
)


def table(runs: list[dict[str, Any]], brief: bool = False) -> str:
  """A markdown table, one column per run; ``brief``: the rows of
  ``BRIEF`` only."""
  names = [os.path.basename(os.path.normpath(s["workdir"])) for s in runs]
  out = ["| | " + " | ".join(names) + " |", "|---" * (len(runs) + 1) + "|"]
  for label, cell in ROWS:
    if brief and label not in BRIEF:
      continue
    out.append(f"| {label} | " + " | ".join(cell(s) for s in runs) + " |")
  return "\n".join(out)


def _points(gain: float) -> str:
  return "-" if np.isnan(gain) else f"{100 * gain:+.1f}"


def _random(record: dict[str, Any]) -> str:
  if "eval/random_success" not in record:
    return "-"
  return (
    f"{_pct(record['eval/random_success'])} "
    f"[{100 * record['eval/random_success_lo']:.1f}, "
    f"{100 * record['eval/random_success_hi']:.1f}]"
  )


def _three(s: dict[str, Any], key: str, fmt: Any) -> str:
  """``key`` untrained, where RL began and at the end ("-": not logged,
  as for a model answering without reasoning)."""
  records = (s["untrained"], s["start"], s["final"])
  if any(key not in r for r in records):
    return "-"
  return " / ".join(fmt(r[key]) for r in records)


def _spread(items: list, most: int = 6) -> list:
  """At most ``most`` of ``items``, evenly spaced, the first and last kept."""
  if len(items) <= most:
    return items
  return [items[round(i)] for i in np.linspace(0, len(items) - 1, most)]


def _final(s: dict[str, Any], key: str, fmt: Any, missing: str = "-") -> str:
  """``key`` at the last evaluation, ``missing`` where it was not logged."""
  return fmt(s["final"][key]) if key in s["final"] else missing


def _per_turn(record: dict[str, Any]) -> str:
  if "eval/num_actions" not in record:
    return "-"
  actions, turns = record["eval/num_actions"], record["eval/num_turns"]
  return f"{actions:.1f} ({actions / max(turns, 1e-9):.1f})"


def _pair(pair: tuple[float, float]) -> str:
  return " / ".join("-" if np.isnan(x) else _pct(x) for x in pair)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--json", help="also write the numbers here")
  parser.add_argument(
    "--evaluation",
    default="eval",
    help="the evaluation's metric prefix (eval_train_env: the Bandit's "
    "training arm names)",
  )
  args = parser.parse_args(argv)
  runs = [summarize(w, args.evaluation) for w in args.workdirs]
  print(table(runs))
  if args.json:
    payload = {"machine": common.machine(), "commit": common.commit()}
    with open(args.json, "w") as f:
      json.dump({**payload, "runs": runs}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
