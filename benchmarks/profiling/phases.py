"""Where a training step's time goes, phase by phase, with the kept groups
compacted and the length bucketed (the config as given) and without (every
group held and masked, the full context: ``filter.capacity`` = all groups,
``algo.length_buckets=1``), on the same rollout and the same parameters.

  python -m benchmarks.profiling.phases  # configs/sokoban.py, tiny
  python -m benchmarks.profiling.phases --arg algo=starpo_s \\
    --set algo.adv_estimator=gae --set algo.length_buckets=4 \\
    --set rollout.max_context=768 --json phases.json

Each phase is jitted on its own (``step.collect``; ``step.prepare_batch``:
score, select, advantages; ``step.update``), run once to compile and then
timed (median of ``--repeats``); the whole step (``assembly.compile_step``,
one jit) is timed the same way. Compile time is reported apart.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import jax

from benchmarks import common
from starpo_jax.algo import step as step_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.run import assembly


def config(name: str, arg: str, overrides: list[str]):
  c = importlib.import_module(f"configs.{name}").get_config(arg or None)
  for item in overrides:
    key, value = item.split("=", 1)
    section, field = key.split(".")
    old = c[section][field]
    c[section][field] = (
      type(old)(value)
      if not isinstance(old, bool)
      else (value.lower() in ("1", "true"))
    )
  c.train.eval_every = 0
  c.diagnostics.collapse_every = c.diagnostics.gradients_every = 0
  return c


def masked(c):
  """The same config with every group held (masked) at full length."""
  c = c.copy_and_resolve_references()
  c.filter.capacity = c.rollout.env_groups
  c.algo.length_buckets = 1
  return c


def phases(c, repeats: int, played: dict[str, Any]) -> dict[str, Any]:
  """Seconds per phase (and compile seconds) of config ``c``. The first
  call plays the rollout that later ones reuse (``played``: also the
  jitted collect and its arguments)."""
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  state = played.setdefault("state", assembly.init_state(setup, learner))
  spec = assembly.step_spec(setup, learner)
  k_roll, k_perm = step_lib.step_keys(state)
  out: dict[str, Any] = {}

  collect = jax.jit(lambda s, codec, key: step_lib.collect(spec, s, codec, key))
  first, out["collect"] = common.time_jitted(
    collect, state, setup.codec, k_roll, repeats=repeats
  )
  played.setdefault("collect", (collect, (state, setup.codec, k_roll)))
  out["collect_compile"] = first - out["collect"]
  traj = played.setdefault("traj", collect(state, setup.codec, k_roll))

  prepare = jax.jit(
    lambda s, codec, traj: step_lib.prepare_batch(spec, s, codec, traj)
  )
  first, out["prepare"] = common.time_jitted(
    prepare, state, setup.codec, traj, repeats=repeats
  )
  out["prepare_compile"] = first - out["prepare"]
  p = prepare(state, setup.codec, traj)

  update = jax.jit(
    lambda s, codec, batch, keep, key: update_lib.update(
      spec, s, codec, batch, keep, key
    )
  )
  args = (state, setup.codec, p.batch, p.selection.row_keep, k_perm)
  first, out["update"] = common.time_jitted(update, *args, repeats=repeats)
  out["update_compile"] = first - out["update"]
  stats = update(*args)[1]
  out["rows"] = int(p.batch.tokens.shape[0])
  out["length"] = int(stats["length"].reshape(-1)[0])
  out["minibatches_trained"] = int(stats["live"].sum())

  whole = assembly.compile_step(
    setup, assembly.init_state(setup, learner), learner
  )
  holder = {"state": assembly.init_state(setup, learner)}

  def run():
    holder["state"], m = whole(holder["state"], setup.codec)
    return m

  first, out["step"] = common.time_jitted(run, repeats=repeats)
  out["step_compile"] = first - out["step"]
  return out


def table(before: dict[str, Any], after: dict[str, Any]) -> str:
  rows = []
  for name, label in (
    ("collect", "collect (rollout)"),
    ("prepare", "score + select + advantages"),
    ("update", "update"),
    ("step", "whole step (one jit)"),
  ):
    rows.append(
      [
        label,
        f"{before[name]:.3f}",
        f"{after[name]:.3f}",
        f"{before[name] / after[name]:.2f}x",
        f"{before[name + '_compile']:.1f} / {after[name + '_compile']:.1f}",
      ]
    )
  rows.append(
    [
      "update holds (episodes x tokens)",
      f"{before['rows']} x {before['length']}",
      f"{after['rows']} x {after['length']}",
      "",
      "",
    ]
  )
  return common.markdown_table(
    [
      "phase",
      "masked, full length s",
      "compacted, bucketed s",
      "speed-up",
      "compile s (masked / compacted)",
    ],
    rows,
  )


def arguments(doc: str, argv: list[str] | None, default: str = "sokoban"):
  """The command line of a step benchmark (a config, by default
  ``configs/{default}.py``, its argument and overrides, ``--repeats``,
  ``--json``) and the config it names."""
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--config", default=default, help="configs/NAME.py")
  parser.add_argument("--arg", default="", help="the config's argument")
  parser.add_argument(
    "--set", action="append", default=[], help="SECTION.NAME=VALUE"
  )
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  return args, config(args.config, args.arg, args.set)


def report(
  args: Any, rows: list[dict[str, Any]], table: Any, **extra: Any
) -> dict[str, Any]:
  """Prints a step benchmark's ``table(rows)``, refuses a step that
  recompiled on a later call, and writes the result (the command line,
  ``rows``, ``extra`` and the machine) to ``args.json``."""
  print(table(rows))
  if any(r["recompiled"] for r in rows):
    raise RuntimeError(f"a step recompiled on a later call: {rows}")
  result = dict(
    config=args.config,
    arg=args.arg,
    overrides=args.set,
    repeats=args.repeats,
    rows=rows,
    **extra,
    machine=common.machine(),
  )
  common.write_json(args.json, result)
  return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args, c = arguments(__doc__, argv)
  played: dict[str, Any] = {}
  print("masked, full length ...", file=sys.stderr, flush=True)
  before = phases(masked(c), args.repeats, played)
  print("compacted, bucketed ...", file=sys.stderr, flush=True)
  after = phases(c, args.repeats, played)
  print(table(before, after))
  result = dict(
    config=args.config,
    arg=args.arg,
    overrides=args.set,
    masked=before,
    compacted=after,
    machine=common.machine(),
  )
  if args.json:
    common.write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
