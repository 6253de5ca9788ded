"""Where a step's time goes, operation by operation: the rollout
(``step.collect``) and the update (``step.update``) of a config, each
jitted alone as in ``benchmarks.profiling.phases``, traced by JAX's
profiler over ``--repeats`` calls after a warm-up call.

  python -m benchmarks.profiling.op_profile  # configs/sokoban.py, tiny
  python -m benchmarks.profiling.op_profile --top 20 --json ops.json

Each operation XLA ran (on a CPU, a thunk: a fusion, a dot, a copy) is
timed from the trace, summed per call and named by the JAX scope it came
from (its HLO ``op_name``). Per phase, two tables:

* the rollout's parts (the named scopes of ``agent/rollout.py`` and
  ``agent/turn.py``: the turn prompt's rendering, its prefill, each decode
  step's forward and sampling, its writes and stop automata (with the
  loop's gathers), parsing, the environment, the turn's end, new levels;
  ``other``: the trajectory's assembly, the carries) and the update's (forward,
  backward, the rest: loss, clipping, optimizer);
* the operations with the most time, with their share.

Times are summed over the threads XLA ran them on, so on several cores
they can exceed the wall time, given beside them. Control operations
(``while``, ``conditional``, ``call``) are left out: the operations of their
bodies are counted instead.

XLA:CPU records its operations only with
``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS``; the command adds
it and runs itself again when it is missing.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

TRACEME = "--xla_cpu_enable_xprof_traceme=true"

# Thunks that only run others: their time is their bodies'.
CONTROL = ("while", "conditional", "call", "cond")

# Scopes that say where in the structure, not what: left out of names.
STRUCTURE = re.compile(
  r"^(while|body|cond|closed_call|checkpoint|remat|branch_\d+_fun|vmap\(\))$"
)

# The rollout's named scopes (``_play``'s turn body, ``decode_token``) and
# the parts they are counted in; the PyTorch loop's clock uses the same
# names (``benchmarks.profiling.loop_phases``).
TURN_PARTS = {
  "new_levels": "new levels",
  "prompt": "render prompt",
  "parse": "parse",
  "tools": "tools",
  "environment": "environment",
  "end_turn": "end of turn",
}
DECODE_PARTS = {
  "forward": "decode: forward",
  "sample": "decode: sample",
  "stop": "decode: writes, stops",
}


def rollout_part(op_name: str) -> str:
  """Which part of the rollout an operation's ``op_name`` belongs to."""
  scopes = op_name.split("/")
  if "prefill" in scopes:
    return "prefill"
  if "decode" in scopes:
    inner = next((p for s, p in DECODE_PARTS.items() if s in scopes), None)
    return inner or "decode: writes, stops"
  for scope, part in TURN_PARTS.items():
    if scope in scopes:
      return part
  return "other"


def update_part(op_name: str) -> str:
  """Forward, backward or the rest of the update."""
  if "transpose(jvp" in op_name:
    return "backward"
  if "jvp(" in op_name:
    return "forward"
  return "loss, clipping, optimizer"


def short(op_name: str, depth: int = 4) -> str:
  """An ``op_name`` without its jit prefix and structural scopes: the
  last ``depth`` scopes that say what the operation computes."""
  scopes = [s for s in op_name.split("/")[1:] if not STRUCTURE.match(s)]
  return "/".join(scopes[-depth:])


def op_names(hlo_text: str) -> dict[str, str]:
  """Each HLO instruction's ``op_name`` (its JAX source scope)."""
  out: dict[str, str] = {}
  for m in re.finditer(
    r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]*)"', hlo_text, re.M
  ):
    out.setdefault(m.group(1), m.group(2))
  return out


def module_name(hlo_text: str) -> str:
  return re.match(r"HloModule ([\w.\-]+)", hlo_text).group(1)


def op_times(xspace: str, module: str) -> dict[str, tuple[float, int]]:
  """Seconds and count of each HLO operation of ``module`` in a trace
  (an ``.xplane.pb``), control operations left out."""
  import jax

  data = jax.profiler.ProfileData.from_file(xspace)
  out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  for plane in data.planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        op = stats.get("hlo_op")
        if op is None or stats.get("hlo_module") != module:
          continue
        if op.split(".")[0] in CONTROL:
          continue
        out[op][0] += event.duration_ns * 1e-9
        out[op][1] += 1
  return {k: (v[0], v[1]) for k, v in out.items()}


def profile(fn, args: tuple, repeats: int, part) -> dict[str, Any]:
  """Traces ``repeats`` calls of the jitted ``fn(*args)`` after one that
  compiles; its operations by part (``part(op_name)``) and by time."""
  import jax

  jax.block_until_ready(fn(*args))
  walls = []
  with tempfile.TemporaryDirectory() as where:
    jax.profiler.start_trace(where)
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      walls.append(time.perf_counter() - start)
    jax.profiler.stop_trace()
    (xspace,) = glob.glob(f"{where}/plugins/profile/*/*.xplane.pb")
    text = fn.lower(*args).compile().as_text()
    times = op_times(xspace, module_name(text))
  if not times:
    raise RuntimeError(
      "the trace holds no XLA operations: run with XLA_FLAGS="
      f"{TRACEME} (set before JAX starts)"
    )
  names = op_names(text)
  total = sum(t for t, _ in times.values()) / repeats
  parts: dict[str, float] = collections.Counter()
  ops: dict[tuple[str, str], list[float]] = collections.defaultdict(
    lambda: [0.0, 0]
  )
  for op, (seconds, count) in times.items():
    name = names.get(op, "")
    parts[part(name)] += seconds / repeats
    key = (op.split(".")[0], short(name))
    ops[key][0] += seconds / repeats
    ops[key][1] += count / repeats
  return dict(
    wall_s=sorted(walls)[len(walls) // 2],
    op_s=total,
    parts=[
      dict(part=p, op_s=s, share=s / total) for p, s in parts.most_common()
    ],
    ops=[
      dict(kind=k, scope=s, op_s=v[0], share=v[0] / total, count=v[1])
      for (k, s), v in sorted(ops.items(), key=lambda kv: -kv[1][0])
    ],
  )


def parts_table(result: dict[str, Any]) -> str:
  """A phase's parts: op-seconds a call and share."""
  from benchmarks import common

  return common.markdown_table(
    ["part", "op-s a call", "share"],
    [[p["part"], p["op_s"], f"{p['share']:.0%}"] for p in result["parts"]],
  )


def ops_table(result: dict[str, Any], top: int) -> str:
  """A phase's ``top`` operations by time."""
  from benchmarks import common

  return common.markdown_table(
    ["operation", "scope", "runs a call", "op-s a call", "share"],
    [
      [o["kind"], o["scope"], round(o["count"]), o["op_s"], f"{o['share']:.1%}"]
      for o in result["ops"][:top]
    ],
  )


def tables(name: str, result: dict[str, Any], top: int) -> str:
  head = (
    f"{name}: {result['wall_s']:.3f} s a call (wall), "
    f"{result['op_s']:.3f} op-s (summed over threads)"
  )
  return f"{head}\n\n{parts_table(result)}\n\n{ops_table(result, top)}\n"


def traced_env() -> dict[str, str]:
  """This process's environment with XLA:CPU recording its operations."""
  flags = os.environ.get("XLA_FLAGS", "")
  if TRACEME in flags:
    return dict(os.environ)
  return dict(os.environ, XLA_FLAGS=f"{flags} {TRACEME}".strip())


def jitted_phases(c) -> dict[str, tuple[Any, tuple]]:
  """Config ``c``'s rollout and update, each jitted alone with the
  arguments of its first step: ``{"collect": (fn, args), "update": ...}``
  (the update's batch is the collected one, scored and selected)."""
  import jax

  from starpo_jax.algo import step as step_lib
  from starpo_jax.algo import update as update_lib
  from starpo_jax.run import assembly

  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  spec = assembly.step_spec(setup, learner)
  k_roll, k_perm = step_lib.step_keys(state)

  @jax.jit
  def collect(state, codec, key):
    return step_lib.collect(spec, state, codec, key)

  @jax.jit
  def prepare(state, codec, traj):
    return step_lib.prepare_batch(spec, state, codec, traj)

  @jax.jit
  def update(state, codec, batch, keep, key):
    return update_lib.update(spec, state, codec, batch, keep, key)

  collect_args = (state, setup.codec, k_roll)
  p = prepare(state, setup.codec, collect(*collect_args))
  update_args = (state, setup.codec, p.batch, p.selection.row_keep, k_perm)
  return {"collect": (collect, collect_args), "update": (update, update_args)}


def run(args: argparse.Namespace) -> dict[str, Any]:
  from benchmarks import common
  from benchmarks.profiling import phases

  c = phases.config(args.config, args.arg, args.set)
  fns = jitted_phases(c)
  out = {}
  for name, part in (("collect", rollout_part), ("update", update_part)):
    print(f"{name} ...", file=sys.stderr, flush=True)
    fn, fn_args = fns[name]
    out[name] = profile(fn, fn_args, args.repeats, part)
    print(tables(name, out[name], args.top))
  result = dict(
    config=args.config,
    arg=args.arg,
    overrides=args.set,
    repeats=args.repeats,
    phases=out,
    machine=common.machine(),
  )
  common.write_json(args.json, result)
  return result


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="sokoban", help="configs/NAME.py")
  parser.add_argument("--arg", default="", help="the config's argument")
  parser.add_argument(
    "--set", action="append", default=[], help="SECTION.NAME=VALUE"
  )
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--top", type=int, default=15, help="operations shown")
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  if TRACEME not in os.environ.get("XLA_FLAGS", ""):
    argv = sys.argv[1:] if argv is None else argv
    command = [sys.executable, "-m", "benchmarks.profiling.op_profile", *argv]
    raise SystemExit(subprocess.run(command, env=traced_env()).returncode)
  return run(args)


if __name__ == "__main__":
  main()
