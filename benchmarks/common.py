"""Timing and reporting helpers shared by the benchmarks.

Every figure is measured, never assumed: a function is compiled and run once
(the compile time is reported apart), then timed over several repeats and
the median reported.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def block(tree: Any) -> Any:
  return jax.block_until_ready(tree)


def time_jitted(
  fn: Callable, *args: Any, repeats: int = 5, min_seconds: float = 0.5
) -> tuple[float, float]:
  """Compile time and median run time of ``fn(*args)`` (a jitted function).

  Runs at least ``repeats`` times and at least ``min_seconds`` in total,
  so that short calls are not dominated by timer noise.

  Returns:
    (seconds for the first call, which includes compiling; median seconds
    per later call).
  """
  start = time.perf_counter()
  block(fn(*args))
  first = time.perf_counter() - start
  times: list[float] = []
  while len(times) < repeats or sum(times) < min_seconds:
    start = time.perf_counter()
    block(fn(*args))
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def time_python(fn: Callable[[], Any], min_seconds: float = 1.0) -> float:
  """Median seconds per call of a host-side function."""
  times: list[float] = []
  while len(times) < 3 or sum(times) < min_seconds:
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``), else what Python knows."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
  """What the figures were measured on."""
  return {
    "cpu": cpu_model(),
    "cores": os.cpu_count(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
    "python": platform.python_version(),
  }


def commit() -> str:
  """The checkout's commit (with ``+changes`` where files differ from it),
  or ``unknown`` outside a git checkout."""
  where = os.path.dirname(os.path.abspath(__file__))
  try:
    head = subprocess.run(
      ["git", "-C", where, "rev-parse", "HEAD"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+changes" if dirty else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  def fmt(v: Any) -> str:
    if isinstance(v, float):
      if v >= 100:
        return f"{v:,.0f}"
      return f"{v:.3g}"
    return str(v)

  lines = [
    "| " + " | ".join(header) + " |",
    "|" + "|".join("---" for _ in header) + "|",
  ]
  lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
  """``payload`` with the commit it was measured at (``commit()``)."""
  if path:
    with open(path, "w") as f:
      json.dump({"commit": commit(), **payload}, f, indent=2, sort_keys=True)
