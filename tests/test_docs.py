"""The documentation runs: the walkthrough of docs/adding_an_environment.md
executes block by block (an environment, its registration, a config, a
training run, a test), every ``python -m`` command the README and the
docs show answers ``--help``, and every table rendered from a JSON file
(``benchmarks/doc_tables.py``) shows what its JSON holds."""

from __future__ import annotations

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
  *sorted((ROOT / "docs").glob("*.md")),
]


def python_blocks(path: pathlib.Path) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.M | re.S)


def test_the_walkthrough_runs(tmp_path):
  blocks = python_blocks(ROOT / "docs" / "adding_an_environment.md")
  assert len(blocks) == 8
  script = tmp_path / "walkthrough.py"
  script.write_text("\n\n".join(blocks))
  out = subprocess.run(
    [sys.executable, str(script)],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=str(ROOT)),
    capture_output=True,
    text=True,
    timeout=600,
  )
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
    m for m in found if m.split(".")[0] in ("starpo_jax", "benchmarks")
  )


def test_every_documented_command_answers_help():
  names = modules()
  assert "starpo_jax.main" in names and "benchmarks.run" in names
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  procs = {
    m: subprocess.Popen(
      [sys.executable, "-m", m, "--help"],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for m in names
  }
  failed = {}
  for m, p in procs.items():
    out, err = p.communicate(timeout=300)
    if p.returncode != 0 or not (out + err).strip():
      failed[m] = (p.returncode, err[-500:])
  assert not failed, failed


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_between_documents_resolve(path):
  for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
    if "://" in target:
      continue
    assert (path.parent / target).exists(), f"{path.name}: {target}"


def test_every_table_matches_the_json_it_is_rendered_from():
  from benchmarks import doc_tables

  assert doc_tables.stale() == [], "run python -m benchmarks.doc_tables"
  # A figure typed over its JSON's is caught.
  text = (ROOT / "docs" / "benchmarks.md").read_text()
  assert "<!-- table run docs/bench_tiny.json -->" in text
  planted = text.replace("| 395,570 |", "| 395,571 |", 1)
  assert planted != text and doc_tables.render(planted) != planted


def test_the_readme_stays_short():
  lines = (ROOT / "README.md").read_text().count("\n")
  assert lines <= 250, f"README.md has {lines} lines; the docs hold the rest"
