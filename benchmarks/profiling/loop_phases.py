"""The StarPO iteration's time phase by phase, and the rollout's part by
part, for the JAX step and the PyTorch loop on the same workload (the
iteration suite's, ``benchmarks.compare.workload``), each side in its own
process.

  python -m benchmarks.profiling.loop_phases                  # tiny model, grpo
  python -m benchmarks.profiling.loop_phases --algo starpo_s \\
    --json docs/data/bench_loop_phases_starpo_s.json
  python -m benchmarks.profiling.loop_phases --smoke          # CI
  python -m benchmarks.profiling.loop_phases --model smollm2-135m \
    --algo starpo_s

JAX: each phase jitted alone and timed as ``phases`` times it (collect;
score, select and advantages in one jit; update) and the whole step in one
jit. Inside the rollout, a part's seconds are its operations' share of the
traced operation time (``op_profile``) times the collect's wall time: XLA
runs the rollout as one program, so no host timer sees its parts.

PyTorch: the static-cache loop of the iteration suite (uncompiled), its
parts timed by the loop's ``Clock`` over ``--repeats`` iterations after
one warm-up. The rollout's ``other``: JAX's trajectory assembly and
carries; PyTorch's Python between its timed parts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

# The rollout's parts, in the order of a turn (``op_profile``'s names,
# which the PyTorch loop's clock shares).
ROLLOUT = (
  "new levels",
  "render prompt",
  "prefill",
  "decode: forward",
  "decode: sample",
  "decode: writes, stops",
  "parse",
  "environment",
  "tools",
  "end of turn",
  "generate (prefill, decode, sampling)",
)
PREPARE = ("batch", "select", "advantages")


def _pair(args: argparse.Namespace):
  from benchmarks.compare import workload

  size = "smoke" if args.smoke else "cpu"
  return workload.Pair(args.model, size, args.workdir, algo=args.algo)


def jax_side(args: argparse.Namespace) -> dict[str, Any]:
  """The JAX step's phases (seconds) and the rollout's parts."""
  from benchmarks.profiling import op_profile, phases

  pair = _pair(args)
  pair.init_jax()  # writes the weights the PyTorch side loads
  played: dict[str, Any] = {}
  timed = phases.phases(pair.config, args.repeats, played)
  fn, fn_args = played["collect"]
  shares = op_profile.profile(fn, fn_args, 2, op_profile.rollout_part)
  out = dict(
    workload=pair.describe(),
    collect=timed["collect"],
    prepare=timed["prepare"],
    update=timed["update"],
    iteration=timed["step"],
    parts={p["part"]: p["share"] * timed["collect"] for p in shares["parts"]},
  )
  out["other"] = out["parts"].pop("other", 0.0)
  return out


def torch_side(args: argparse.Namespace) -> dict[str, Any]:
  """The PyTorch loop's phases (seconds an iteration) and parts."""
  pair = _pair(args)
  pair.init_torch("cpu")
  loop = pair.torch_loop("static")
  loop.iteration()  # warm-up
  loop.clock.seconds.clear()
  start = time.perf_counter()
  for _ in range(args.repeats):
    loop.iteration()
  iteration = (time.perf_counter() - start) / args.repeats
  per = {k: v / args.repeats for k, v in loop.clock.seconds.items()}
  return dict(
    workload=pair.describe(),
    collect=per.pop("collect"),
    prepare=sum(per.pop(k, 0.0) for k in PREPARE),
    update=per.pop("update"),
    iteration=iteration,
    parts=per,
  )


SIDES = {"jax": jax_side, "torch": torch_side}


def table(result: dict[str, Any]) -> str:
  """The phases and the rollout's parts, JAX beside PyTorch."""
  from benchmarks import common

  j, t = result["jax"], result["torch"]
  rows = []

  def row(label: str, a: float | None, b: float | None) -> None:
    ratio = f"{b / a:.2f}x" if a and b else ""
    rows.append([label, "" if a is None else a, "" if b is None else b, ratio])

  row("collect (rollout)", j["collect"], t["collect"])
  names = [p for p in ROLLOUT if p in j["parts"] or p in t["parts"]]
  names += sorted((set(j["parts"]) | set(t["parts"])) - set(ROLLOUT))
  for name in names:
    row(f"rollout: {name}", j["parts"].get(name), t["parts"].get(name))
  # PyTorch's: the Python between its timed parts.
  row("rollout: other", j["other"], t["collect"] - sum(t["parts"].values()))
  row("score, select, advantages", j["prepare"], t["prepare"])
  row("update", j["update"], t["update"])
  row("whole iteration", j["iteration"], t["iteration"])
  return common.markdown_table(
    ["phase", "JAX s", "PyTorch s", "PyTorch / JAX"], rows
  )


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
  from benchmarks.compare.run import MODELS

  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--algo", default="grpo", choices=("grpo", "starpo_s"), help="preset"
  )
  parser.add_argument(
    "--model", default="tiny", choices=MODELS, help="the iteration suite's"
  )
  parser.add_argument("--smoke", action="store_true", help="smallest size")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default="")
  parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
  parser.add_argument("--workdir", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.side:
    # One side in this process: its figures, as JSON, on stdout's last line.
    print(json.dumps(SIDES[args.side](args)))
    return None
  from benchmarks import common
  from benchmarks.profiling import op_profile

  result: dict[str, Any] = {}
  with tempfile.TemporaryDirectory() as workdir:
    for side in ("jax", "torch"):  # JAX writes the weights PyTorch loads
      print(f"{side} ...", file=sys.stderr, flush=True)
      command = [sys.executable, "-m", "benchmarks.profiling.loop_phases"]
      command += ["--side", side, "--workdir", workdir, "--algo", args.algo]
      command += ["--model", args.model]
      command += ["--repeats", str(args.repeats)]
      command += ["--smoke"] if args.smoke else []
      env = op_profile.traced_env() if side == "jax" else dict(os.environ)
      done = subprocess.run(command, capture_output=True, text=True, env=env)
      if done.returncode:
        raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
      result[side] = json.loads(done.stdout.strip().splitlines()[-1])
  print(f"{result['jax']['workload']}, {args.repeats} repeats")
  print(table(result))
  result.update(
    model=args.model,
    algo=args.algo,
    smoke=args.smoke,
    repeats=args.repeats,
    machine=common.machine(),
  )
  common.write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
