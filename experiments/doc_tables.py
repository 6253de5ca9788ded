"""The docs' tables, rendered from the JSON files the benchmarks and
evaluations write: no figure is typed into Markdown by hand.

  python -m experiments.doc_tables           # rewrites every table
  python -m experiments.doc_tables --check   # exits 1 naming a stale one
  python -m experiments.doc_tables --show learning \
    docs/data/learning_rl_alone_sokoban.json  # any JSON's table, printed

The docs show each study's headline tables; ``--show KIND FILE
[OPTION=VALUE ...]`` prints any other table a JSON holds (every seed,
every variant, every setting) as a document would show it.

A table in a document sits between two markers naming its renderer and
its JSON file (and, for benchmark rows, which suites):

  <!-- table run docs/data/bench_tiny.json suites=rollout -->
  | suite | ... |
  <!-- /table -->

(``suites=`` and ``savings=``, comma-separated, keep those rows; the
``savings`` renderer gives a line per saving against the defaults.)

Each renderer is the ``table`` function of the command that wrote the
JSON: in ``benchmarks.compare``, ``run`` and ``warm_start``; in
``benchmarks.profiling``, ``phases``, ``context_window``, ``mixture``,
``tpu_memory`` (and ``tpu_phases``: its roofline by phase), ``op_profile``
(``phase=`` and, for its operations, ``top=``), ``loop_phases`` and
``matmul``; in ``benchmarks.components``, ``envs`` (``envs=`` keeps those
environments' rows) and ``host_bridge`` (``part=iterations`` or
``round_trip``); in ``experiments``, ``learning_table``,
``mixture_table``, ``mixture_seeds``, ``zero_shot_table``,
``variants_table`` and ``study_table``. So a
document shows exactly what the command printed. ``tests/test_docs.py``
fails when a table and its JSON disagree. Under each table a line names
the machine its JSON says it was measured on.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(
  r"(<!-- table (?P<kind>\w+) (?P<file>\S+)(?P<options>(?: \w+=\S+)*) -->\n)"
  r"(?P<body>.*?)"
  r"(<!-- /table -->)",
  re.S,
)


def _run(data: dict[str, Any], suites: str = "", savings: str = "") -> str:
  from benchmarks.compare import rows

  wanted = set(suites.split(",")) if suites else None
  saved = set(savings.split(",")) if savings else None

  def saving(r: dict[str, Any]) -> str:
    m = rows.SAVED.fullmatch(r["workload"])
    return m["savings"] if m else "on"

  return rows.table(
    [
      r
      for r in data["rows"]
      if (wanted is None or r["suite"] in wanted)
      and (saved is None or saving(r) in saved)
    ]
  )


def _savings(data: dict[str, Any]) -> str:
  from benchmarks.compare import rows

  return rows.savings_table(data["rows"])


def _phases(data: dict[str, Any]) -> str:
  from benchmarks.profiling import phases

  return phases.table(data["masked"], data["compacted"])


def _context_window(data: dict[str, Any]) -> str:
  from benchmarks.profiling import context_window

  return context_window.table(data["rows"])


def _mixture(data: dict[str, Any]) -> str:
  from benchmarks.profiling import mixture

  return mixture.table(data["rows"])


def _mixture_learning(data: dict[str, Any]) -> str:
  from experiments import mixture_table

  return mixture_table.table(data["parts"])


def _mixture_seeds(data: dict[str, Any]) -> str:
  from experiments import mixture_seeds

  return mixture_seeds.table(data["rows"], data["limit"])


def _variants(data: dict[str, Any]) -> str:
  from experiments import variants_table

  return variants_table.table(data["policies"], data["temperature"])


def _tpu_memory(data: list[dict[str, Any]]) -> str:
  from benchmarks.profiling import tpu_memory

  return tpu_memory.table(data)


def _tpu_phases(data: list[dict[str, Any]]) -> str:
  from benchmarks.profiling import tpu_memory

  return tpu_memory.phase_table(data)


def _learning(data: dict[str, Any], rows: str = "all") -> str:
  from experiments import learning_table

  if rows not in ("all", "brief"):
    raise TypeError(f"rows={rows!r}; expected all or brief")
  return learning_table.table(data["runs"], brief=rows == "brief")


def _zero_shot(data: dict[str, Any]) -> str:
  from experiments import zero_shot_table

  kept = {k: v for k, v in data.items() if isinstance(v, dict) and "envs" in v}
  return zero_shot_table.table(kept)


def _op_profile(data: dict[str, Any], phase: str, top: str = "") -> str:
  from benchmarks.profiling import op_profile

  result = data["phases"][phase]
  if top:
    return op_profile.ops_table(result, int(top))
  return op_profile.parts_table(result)


def _loop_phases(data: dict[str, Any]) -> str:
  from benchmarks.profiling import loop_phases

  return loop_phases.table(data)


def _matmul(data: dict[str, Any]) -> str:
  from benchmarks.profiling import matmul

  return matmul.table(data["rows"])


def _study(data: dict[str, Any]) -> str:
  from experiments import study_table

  return study_table.table(data["columns"])


def _envs(data: dict[str, Any], envs: str = "") -> str:
  from benchmarks.components import envs as envs_bench

  wanted = set(envs.split(",")) if envs else None
  return envs_bench.table(
    [r for r in data["rows"] if wanted is None or r["env"] in wanted]
  )


def _envs_difficulty(data: dict[str, Any]) -> str:
  from benchmarks.components import envs as envs_bench

  return envs_bench.difficulty_table(data["difficulty"])


def _host_bridge(data: dict[str, Any], part: str = "iterations") -> str:
  from benchmarks.components import host_bridge

  if part == "iterations":
    return host_bridge.table(data["iterations"])
  if part == "round_trip":
    return host_bridge.round_trip_table(data["round_trip"])
  raise TypeError(f"part={part!r}; expected iterations or round_trip")


def _warm_start(data: dict[str, Any]) -> str:
  from benchmarks.compare import warm_start

  return warm_start.table(data)


RENDERERS: dict[str, Callable[..., str]] = {
  "study": _study,
  "envs": _envs,
  "envs_difficulty": _envs_difficulty,
  "host_bridge": _host_bridge,
  "run": _run,
  "savings": _savings,
  "phases": _phases,
  "context_window": _context_window,
  "mixture": _mixture,
  "mixture_learning": _mixture_learning,
  "mixture_seeds": _mixture_seeds,
  "variants": _variants,
  "tpu_memory": _tpu_memory,
  "tpu_phases": _tpu_phases,
  "learning": _learning,
  "zero_shot": _zero_shot,
  "op_profile": _op_profile,
  "loop_phases": _loop_phases,
  "matmul": _matmul,
  "warm_start": _warm_start,
}


def cpu_name(cpu: str) -> str:
  """``/proc/cpuinfo``'s model name without its marks:
  ``Intel(R) Xeon(R) Processor`` -> ``Intel Xeon``."""
  name = re.sub(r"\((?:R|TM)\)|\bProcessor\b|\bCPU\b.*", " ", cpu)
  return " ".join(name.split()) or cpu


def caption(data: Any, file: str) -> str:
  """The line under a table naming the machine its JSON was measured on
  (``common.machine()``), or, for a summary of other tables, theirs; ""
  where the JSON names none (an ahead-of-time TPU compile)."""
  if not isinstance(data, dict):
    return ""
  if "machine" in data:
    m = data["machine"]
    where = f"a {m['cores']}-core {cpu_name(m['cpu'])}"
    if m["backend"] != "cpu":
      where = f"{m['backend']} ({', '.join(m['devices'])}) beside {where}"
    return f"Measured on {where}, JAX {m['jax']} (`{file}`)."
  cpus = [cpu_name(s["cpu"]) for s in data.get("sources", ()) if "cpu" in s]
  if not cpus:
    return ""
  counts = ", ".join(f"{c} {cpus.count(c)}" for c in dict.fromkeys(cpus))
  return f"From {len(cpus)} tables, by machine: {counts} (`{file}`)."


def one_table(
  kind: str, file: str, options: dict[str, str], where: str = ""
) -> str:
  """The table ``kind`` renders from ``file`` (a path from the
  repository's root) with ``options``, and the line naming its machine.

  Raises:
    ValueError: an unknown renderer or option, or a JSON file missing,
      naming ``where`` it was asked for.
  """
  if kind not in RENDERERS:
    raise ValueError(
      f"{where}: table renderer {kind!r} unknown; known: {sorted(RENDERERS)}"
    )
  path = ROOT / file
  if not path.is_file():
    raise ValueError(f"{where}: table from {file}, which does not exist")
  data = json.loads(path.read_text())
  try:
    table = RENDERERS[kind](data, **options)
  except TypeError as e:
    raise ValueError(f"{where}: table {kind} {file}: {e}") from None
  note = caption(data, file)
  return table.rstrip("\n") + (f"\n\n{note}" if note else "")


def render(text: str, where: str = "") -> str:
  """``text`` with every table block rendered from its JSON.

  Raises:
    ValueError: an unknown renderer or option, or a JSON file missing,
      naming the document and the block.
  """

  def one(m: re.Match) -> str:
    options = dict(o.split("=", 1) for o in m["options"].split())
    table = one_table(m["kind"], m["file"], options, where)
    return m.group(1) + table + "\n" + m.group(6)

  return BLOCK.sub(one, text)


def documents() -> list[pathlib.Path]:
  return sorted({p for g in DOCUMENTS for p in ROOT.glob(g)})


def stale() -> list[str]:
  """The documents whose tables differ from what their JSON renders."""
  return [
    str(p.relative_to(ROOT))
    for p in documents()
    if render(p.read_text(), p.name) != p.read_text()
  ]


def main(argv: list[str] | None = None) -> list[str]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--check", action="store_true", help="change nothing; exit 1 if stale"
  )
  parser.add_argument(
    "--show",
    nargs="+",
    metavar="ARG",
    help="KIND FILE [OPTION=VALUE ...]: print one table "
    f"(KIND: {', '.join(sorted(RENDERERS))})",
  )
  args = parser.parse_args(argv)
  if args.show:
    if len(args.show) < 2 or any("=" not in o for o in args.show[2:]):
      parser.error(
        f"--show takes KIND FILE [OPTION=VALUE ...], not {args.show}"
      )
    kind, file, *options = args.show
    try:
      print(one_table(kind, file, dict(o.split("=", 1) for o in options)))
    except ValueError as e:
      parser.error(str(e).lstrip(": "))
    return []
  out = stale()
  if args.check:
    for path in out:
      print(f"{path}: a table differs from its JSON", file=sys.stderr)
    if out:
      sys.exit(1)
    return out
  for path in documents():
    text = path.read_text()
    new = render(text, path.name)
    if new != text:
      path.write_text(new)
      print(f"rendered {path.relative_to(ROOT)}")
  return out


if __name__ == "__main__":
  main()
