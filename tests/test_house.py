"""The house rules a reader relies on (issue: a house a newcomer can
change): no function in the library or the environments longer than 80
lines, and benchmarks that import nothing from the tests."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 80


def functions(folder: str):
  for path in sorted((ROOT / folder).rglob("*.py")):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        yield path.relative_to(ROOT), node


@pytest.mark.parametrize("folder", ["starpo_jax", "envs"])
def test_no_function_is_longer_than_80_lines(folder):
  long = [
    f"{path}:{node.lineno} {node.name} ({n} lines)"
    for path, node in functions(folder)
    if (n := node.end_lineno - node.lineno + 1) > MAX_LINES
  ]
  assert not long, long


def test_benchmarks_import_nothing_from_tests():
  imports = []
  for path in sorted((ROOT / "benchmarks").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module]
      imports += [
        f"{path.relative_to(ROOT)}: {n}"
        for n in names
        if n == "tests" or n.startswith("tests.")
      ]
  assert not imports, imports
