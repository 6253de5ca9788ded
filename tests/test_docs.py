"""The documentation runs: the walkthrough of docs/adding_an_environment.md
executes block by block (an environment, its registration, a config, a
training run, a test), every ``python -m`` command the README and the
docs show answers ``--help``, and every table rendered from a JSON file
(``experiments/doc_tables.py``) shows what its JSON holds."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [
  ROOT / "README.md",
  ROOT / "launch" / "README.md",
  ROOT / "benchmarks" / "README.md",
  *sorted((ROOT / "docs").glob("*.md")),
]


def python_blocks(path: pathlib.Path) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.M | re.S)


def python(*args: str, cwd, timeout: int) -> subprocess.CompletedProcess:
  """``python ARGS`` in ``cwd`` with this checkout importable."""
  return subprocess.run(
    [sys.executable, *args],
    cwd=cwd,
    env=dict(os.environ, PYTHONPATH=str(ROOT)),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_the_walkthrough_runs(tmp_path):
  blocks = python_blocks(ROOT / "docs" / "adding_an_environment.md")
  assert len(blocks) == 8
  script = tmp_path / "walkthrough.py"
  script.write_text("\n\n".join(blocks))
  out = python(str(script), cwd=tmp_path, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  # The training run wrote its checkpoint and metrics where it said.
  run = tmp_path / "runs" / "corridor"
  assert (run / "checkpoints" / "2").is_dir()
  assert (run / "metrics.jsonl").is_file()
  # And the plain-Python corridor, stepped through envs.batch.host.
  assert (tmp_path / "runs" / "plain_corridor" / "metrics.jsonl").is_file()
  # And the same with a tool.
  assert (tmp_path / "runs" / "corridor_notes" / "metrics.jsonl").is_file()


def modules() -> list[str]:
  found = set()
  for path in DOCS:
    found |= set(re.findall(r"python3? -m ([\w.]+)", path.read_text()))
  # Tools of others (pip, pytest, venv) are theirs to document.
  return sorted(
    m
    for m in found
    if m.split(".")[0] in ("starpo_jax", "benchmarks", "experiments")
  )


# Every command's --help in one process (one Python and one set of imports
# instead of one per command: 3 CPU seconds instead of 43), each run as
# `python -m` runs it; the absl flags a command defines are removed after
# it, as its own process would never have had them.
_ANSWER_HELP = """
import contextlib, io, json, runpy, sys
from absl import app, flags, logging
shared = set(flags.FLAGS)
answers = {}
for m in sys.argv[1:]:
  sys.argv = [m, "--help"]
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
      runpy.run_module(m, run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      code = e.code or 0
    except Exception as e:
      code = repr(e)
  for name in set(flags.FLAGS) - shared:
    delattr(flags.FLAGS, name)
  answers[m] = [code, out.getvalue()[-500:]]
print(json.dumps(answers))
"""


def test_every_documented_command_answers_help():
  names = modules()
  assert "starpo_jax.main" in names and "benchmarks.compare.run" in names
  out = python("-c", _ANSWER_HELP, *names, cwd=ROOT, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  answers = json.loads(out.stdout.splitlines()[-1])
  assert sorted(answers) == names
  failed = {m: a for m, a in answers.items() if a[0] != 0 or not a[1].strip()}
  assert not failed, failed


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_between_documents_resolve(path):
  for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
    if "://" in target:
      continue
    assert (path.parent / target).exists(), f"{path.name}: {target}"


def test_every_table_matches_the_json_it_is_rendered_from():
  from experiments import doc_tables

  assert doc_tables.stale() == [], "run python -m experiments.doc_tables"
  # A figure typed over its JSON's is caught.
  text = (ROOT / "docs" / "benchmarks.md").read_text()
  marker = "<!-- table run docs/data/bench_tiny.json suites="
  assert marker in text
  start = text.index(marker)
  cell = re.search(r"\| generated tokens/s \| (\d)", text[start:])
  digit = str((int(cell[1]) + 1) % 10)
  at = start + cell.start(1)
  planted = text[:at] + digit + text[at + 1 :]
  assert planted != text and doc_tables.render(planted) != planted


def test_each_table_names_the_machine_its_json_was_measured_on():
  from experiments import doc_tables

  assert doc_tables.cpu_name("Intel(R) Xeon(R) Processor") == "Intel Xeon"
  assert doc_tables.cpu_name("Intel(R) Xeon(R) CPU @ 2.20GHz") == "Intel Xeon"
  assert doc_tables.cpu_name("AMD EPYC 7B13") == "AMD EPYC 7B13"
  named = 0
  for path in doc_tables.documents():
    for block in doc_tables.BLOCK.finditer(path.read_text()):
      data = json.loads((ROOT / block["file"]).read_text())
      last = block["body"].rstrip().splitlines()[-1]
      if isinstance(data, dict) and "machine" in data:
        machine = data["machine"]
        words = re.sub(r"\((R|TM)\)|Processor", " ", machine["cpu"]).split()
        expected = [f"{machine['cores']}-core", *words, block["file"]]
      elif isinstance(data, dict) and "sources" in data:
        # A summary of other tables: how many were measured on each CPU.
        cpus = [s["cpu"].replace("(R)", "") for s in data["sources"]]
        cpus = [" ".join(c.replace("Processor", "").split()) for c in cpus]
        expected = [f"{c} {cpus.count(c)}" for c in set(cpus)]
      else:
        continue
      missing = [w for w in expected if w not in last]
      assert not missing, f"{path.name}: {block['file']}'s table: {missing}"
      named += 1
  assert named > 15


# A measured figure: an interval, a decimal ratio, percentage or time.
FIGURE = re.compile(
  r"\[\d+\.\d, \d+\.\d\]|\d\.\d+x\b|\d\.\d%|\d\.\d+ (?:s|min|ms|GiB)\b"
)


TARGET = re.compile(r"[<>]=\s*\d+(?:\.\d+)?x")


def hand_typed_figures(text: str) -> list[str]:
  """The table rows of ``text`` that hold a measured figure outside a
  rendered table block."""
  rows, rendered = [], False
  for line in (raw.strip() for raw in text.splitlines()):
    if line.startswith("<!-- table "):
      rendered = True
    elif line.startswith("<!-- /table"):
      rendered = False
    # A target (">= 1.5x", "<= 1.5x") is not a measurement.
    elif (
      line.startswith("|")
      and not rendered
      and FIGURE.search(TARGET.sub("", line))
    ):
      rows.append(line)
  return rows


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_table_of_figures_is_typed_by_hand(path):
  assert hand_typed_figures(path.read_text()) == [], (
    f"{path.name}: a table of measured figures outside a rendered block "
    "(write its JSON and render it: python -m experiments.doc_tables)"
  )
  # The check sees a figure typed into a table, and not one rendered.
  typed = "| run | 61.2% [57.0, 65.3] |"
  assert hand_typed_figures(f"text\n{typed}\n") == [typed]
  assert hand_typed_figures(f"- a list item:\n\n  {typed}\n") == [typed]
  rendered = f"<!-- table learning x.json -->\n{typed}\n<!-- /table -->\n"
  assert hand_typed_figures(rendered) == []


def test_the_readme_stays_short():
  lines = (ROOT / "README.md").read_text().count("\n")
  assert lines <= 250, f"README.md has {lines} lines; the docs hold the rest"


# A reader finds each answer in a few pages: every page within its limit,
# the whole under its own, the figures' JSON in a folder of its own.
MAX_PAGE_LINES = 400
MAX_DOCS_LINES = 2000


def test_the_docs_stay_a_few_pages():
  pages = sorted((ROOT / "docs").glob("*.md"))
  lines = {p.name: p.read_text().count("\n") for p in pages}
  assert len(lines) >= 5, lines
  long = {name: n for name, n in lines.items() if n > MAX_PAGE_LINES}
  assert not long, f"pages over {MAX_PAGE_LINES} lines: {long}"
  assert sum(lines.values()) < MAX_DOCS_LINES, lines
  assert not list((ROOT / "docs").glob("*.json")), "JSON goes in docs/data/"
  assert list((ROOT / "docs" / "data").glob("*.json"))
