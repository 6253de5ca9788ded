"""Plain float32 matmuls at the shapes the models' steps multiply, JAX
against PyTorch, each in its own process with every core of the machine:
whether a framework's dense kernels, rather than what is around them,
explain a step's speed on the CPU a reader has.

  python -m benchmarks.profiling.matmul  # GFLOP/s, both frameworks
  python -m benchmarks.profiling.matmul --json docs/data/bench_matmul.json
  python -m benchmarks.profiling.matmul --smoke            # small shapes, CI

JAX times ``jax.jit(lambda a, b: a @ b)``; PyTorch times ``a @ b`` under
``torch.inference_mode``; each the median of calls after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

# (what multiplies it, rows, inner, columns): the tiny model's update of 32
# episodes of 768 tokens (24,576 rows; hidden 128, MLP 384), its fused
# gate and up projection; Qwen2.5-0.5B's MLP over 768 tokens; SmolLM2-135M
# decoding 128 rows; and a square reference.
SHAPES = (
  ("tiny MLP up, 32 x 768 tokens", 24576, 128, 384),
  ("tiny gate+up fused", 24576, 128, 512),
  ("tiny MLP down (512 in)", 24576, 512, 128),
  ("qwen2.5-0.5b MLP up, 768 tokens", 768, 896, 4864),
  ("smollm2-135m MLP up, 128 rows", 128, 576, 1536),
  ("square 2048", 2048, 2048, 2048),
)
SMOKE_ROWS = 16  # --smoke divides every shape's rows by this


def shapes(smoke: bool) -> list[tuple[str, int, int, int]]:
  if not smoke:
    return list(SHAPES)
  return [(n, max(1, m // SMOKE_ROWS), k, c) for n, m, k, c in SHAPES]


def _median_seconds(call, min_seconds: float, repeats: int) -> float:
  call()
  times: list[float] = []
  while len(times) < repeats or sum(times) < min_seconds:
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def jax_side(todo, min_seconds: float, repeats: int) -> list[float]:
  import jax
  import numpy as np

  matmul = jax.jit(lambda a, b: a @ b)
  rng = np.random.default_rng(0)
  out = []
  for _, m, k, n in todo:
    a = jax.device_put(rng.standard_normal((m, k), np.float32))
    b = jax.device_put(rng.standard_normal((k, n), np.float32))
    out.append(
      _median_seconds(
        lambda a=a, b=b: matmul(a, b).block_until_ready(), min_seconds, repeats
      )
    )
  return out


def torch_side(todo, min_seconds: float, repeats: int) -> list[float]:
  import torch

  torch.set_num_threads(os.cpu_count() or 1)
  gen = torch.Generator().manual_seed(0)
  out = []
  with torch.inference_mode():
    for _, m, k, n in todo:
      a = torch.randn(m, k, generator=gen)
      b = torch.randn(k, n, generator=gen)
      out.append(_median_seconds(lambda a=a, b=b: a @ b, min_seconds, repeats))
  return out


SIDES = {"jax": jax_side, "torch": torch_side}


def table(rows: list[dict[str, Any]]) -> str:
  from benchmarks import common

  return common.markdown_table(
    [
      "matmul",
      "[M, K] x [K, N]",
      "JAX GFLOP/s",
      "PyTorch GFLOP/s",
      "JAX / PyTorch",
    ],
    [
      [
        r["shape"],
        f"[{r['m']}, {r['k']}] x [{r['k']}, {r['n']}]",
        r["jax_gflops"],
        r["torch_gflops"],
        f"{r['jax_gflops'] / r['torch_gflops']:.2f}x",
      ]
      for r in rows
    ],
  )


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--smoke", action="store_true", help="small shapes")
  parser.add_argument("--min-seconds", type=float, default=0.5)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default="")
  parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  todo = shapes(args.smoke)
  if args.side:
    # One framework in this process: its seconds per shape on stdout.
    print(json.dumps(SIDES[args.side](todo, args.min_seconds, args.repeats)))
    return None
  seconds = {}
  for side in ("jax", "torch"):
    print(f"{side} ...", file=sys.stderr, flush=True)
    command = [
      sys.executable,
      "-m",
      "benchmarks.profiling.matmul",
      "--side",
      side,
    ]
    command += ["--min-seconds", str(args.min_seconds)]
    command += ["--repeats", str(args.repeats)] + (
      ["--smoke"] if args.smoke else []
    )
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f"the {side} side failed:\n{done.stderr[-2000:]}")
    seconds[side] = json.loads(done.stdout.strip().splitlines()[-1])
  rows = [
    dict(
      shape=name,
      m=m,
      k=k,
      n=n,
      jax_gflops=2 * m * k * n / seconds["jax"][i] / 1e9,
      torch_gflops=2 * m * k * n / seconds["torch"][i] / 1e9,
    )
    for i, (name, m, k, n) in enumerate(todo)
  ]
  print(table(rows))
  from benchmarks import common

  result = dict(smoke=args.smoke, rows=rows, machine=common.machine())
  common.write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
