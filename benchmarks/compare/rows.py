"""A row of the comparison: made on each side (``row``, ``torch_rate``,
``Measured``), merged across the sides' processes (``merge``) and printed
(``table``, ``savings_table``). The runner, the suites, the Tunix side by
side and the docs' renderer all read rows through this module."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from benchmarks import common
from benchmarks.compare.workload import Timing


def row(suite, pair, metric, jax_value, baseline, torch_value, **extra):
  return dict(
    suite=suite,
    workload=pair if isinstance(pair, str) else pair.describe(),
    metric=metric,
    jax=jax_value,
    baseline=baseline,
    torch=torch_value,
    ratio=jax_value / torch_value,
    **extra,
  )


@dataclasses.dataclass(frozen=True)
class Measured:
  """One JAX measurement: ``run`` makes one call (the first compiles);
  ``row`` turns the calls' ``Timing`` into the suite's row. Split so that
  several (the savings) can be timed taking turns."""

  run: Callable[[], None]
  row: Callable[[Timing], dict[str, Any]]


def torch_rate(label: str, value: float, t: Timing, workload: str = ""):
  """A PyTorch baseline's figure, its process's peak memory while it ran
  (GiB), and the workload it ran (empty: the pair's)."""
  return dict(workload=workload, label=label, value=value, peak_gib=t.peak_gib)


def merge(
  jax_rows: list[dict[str, Any]], torch_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
  """Rows of both sides: each JAX measurement beside each of its
  workload's baselines (the env suite's rows are whole already); a
  measurement with other savings than the defaults also beside the
  defaults' (``SAVINGS``), its workload named with them."""
  rows = [r for r in jax_rows if r["suite"] == "env"]
  baselines: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for b in torch_rows:
    baselines.setdefault((b["suite"], b["workload"]), []).append(b)
  halves = [r for r in jax_rows if r["suite"] != "env"]
  if {(h["suite"], h["workload"]) for h in halves} != set(baselines):
    raise RuntimeError(
      f"the sides measured different workloads: {sorted(baselines)} and "
      f"{sorted({(h['suite'], h['workload']) for h in halves})}"
    )
  defaults = {
    (h["suite"], h["workload"]): h["jax"]
    for h in halves
    if h.get("savings", "on") == "on"
  }
  for half in halves:
    key = (half["suite"], half["workload"])
    savings = half.get("savings", "on")
    rates = list(baselines[key])
    if savings != "on" and key in defaults:
      rates.append(dict(label="starpo-jax, savings on", value=defaults[key]))
    extra = {
      k: v
      for k, v in half.items()
      if k not in ("suite", "workload", "metric", "jax", "savings")
    }
    workload = half["workload"]
    if savings != "on":
      workload += f", savings {savings}"
    for rate in rates:
      peak = {"torch_peak_gib": rate["peak_gib"]} if "peak_gib" in rate else {}
      rows.append(
        row(
          half["suite"],
          workload,
          half["metric"],
          half["jax"],
          rate["label"],
          rate["value"],
          **extra,
          **peak,
        )
      )
  return rows


HEADER = [
  "suite",
  "workload",
  "metric",
  "starpo-jax",
  "baseline",
  "baseline value",
  "ratio",
  "JAX compile s",
  "JAX peak RSS GiB",
  "baseline peak RSS GiB",
  "% matmul peak",
  "% bandwidth",
]


def table(rows: list[dict[str, Any]]) -> str:
  pct = lambda r, k: f"{100 * r[k]:.1f}" if k in r else "-"
  return common.markdown_table(
    HEADER,
    [
      [
        r["suite"],
        r["workload"],
        r["metric"],
        r["jax"],
        r["baseline"],
        r["torch"],
        f"{r['ratio']:.2f}x",
        f"{r['compile_s']:.1f}",
        f"{r['peak_gib']:.2f}",
        f"{r['torch_peak_gib']:.2f}" if "torch_peak_gib" in r else "-",
        pct(r, "flops_frac"),
        pct(r, "bandwidth_frac"),
      ]
      for r in rows
    ],
  )


SAVED = re.compile(r"(?P<workload>.*), savings (?P<savings>\w+)$")


def savings_table(rows: list[dict[str, Any]]) -> str:
  """One line per workload and saving (``--savings``): its JAX figure,
  its ratio to the same workload with the defaults, and the share of
  decode slots that made no token (rollout rows)."""
  on, lines = {}, {}
  for r in rows:
    m = SAVED.fullmatch(r["workload"])
    workload, saved = (
      (m["workload"], m["savings"]) if m else (r["workload"], "on")
    )
    if saved == "on":
      on[(r["suite"], workload)] = r["jax"]
    lines.setdefault((r["suite"], workload, saved), r)
  body = []
  for (suite, workload, saved), r in lines.items():
    idle = f"{100 * r['decode_idle']:.1f}%" if "decode_idle" in r else "-"
    body.append(
      [
        suite,
        workload,
        saved,
        r["metric"],
        r["jax"],
        f"{r['jax'] / on[(suite, workload)]:.2f}x",
        idle,
      ]
    )
  return common.markdown_table(
    [
      "suite",
      "workload",
      "savings",
      "metric",
      "starpo-jax",
      "against savings on",
      "decode slots idle",
    ],
    body,
  )
