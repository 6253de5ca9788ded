"""The house rules a reader relies on: the library's subpackages import
one way (``models`` <- ``agent`` <- ``algo`` <- ``run`` <- ``cli``), with
no import cycle; the environments import nothing from the library; no
function in the library or the environments is longer than 80 lines; the
benchmarks import nothing from the tests."""

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


# Each subpackage imports only from its own and lower layers; the command
# modules at the top (``python -m starpo_jax.main``) only run ``cli``.
LAYERS = {
  "starpo_jax.sharding": 0,
  "starpo_jax.settings": 0,
  "starpo_jax.models": 1,
  "starpo_jax.agent": 2,
  "starpo_jax.algo": 3,
  "starpo_jax.run": 4,
  "starpo_jax.cli": 5,
}
COMMAND = 6


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
  path = ROOT / name.replace(".", "/")
  return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(folder: str) -> dict[str, set[str]]:
  """Every module of ``folder`` and the modules it imports (at its top or
  inside functions), as dotted names."""
  graph = {}
  for path in sorted((ROOT / folder).rglob("*.py")):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module:
        for a in node.names:
          full = f"{node.module}.{a.name}"
          found.add(full if is_module(full) else node.module)
    graph[module_name(path)] = found
  return graph


def layer(module: str) -> int:
  for prefix, rank in LAYERS.items():
    if module == prefix or module.startswith(prefix + "."):
      return rank
  return COMMAND


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """An import cycle among the graph's modules, if there is one."""
  done, path = set(), []

  def visit(m: str) -> list[str] | None:
    if m in path:
      return [*path[path.index(m) :], m]
    if m in done:
      return None
    path.append(m)
    for n in sorted(graph[m] & graph.keys()):
      if found := visit(n):
        return found
    path.pop()
    done.add(m)
    return None

  for m in sorted(graph):
    if found := visit(m):
      return found
  return None


def test_the_library_has_no_import_cycle():
  graph = imports("starpo_jax")
  assert len(graph) > 30
  assert cycle(graph) is None, " -> ".join(cycle(graph))
  # The check finds one where there is one.
  looped = {**graph, "starpo_jax.models.lora": {"starpo_jax.run.train"}}
  assert cycle(looped)


def test_subpackages_import_only_their_own_and_lower_layers():
  graph = imports("starpo_jax")
  wrong = [
    f"{m} imports {n}"
    for m, found in graph.items()
    for n in found
    if n.startswith("starpo_jax.") and layer(n) > layer(m)
  ]
  assert not wrong, wrong
  # The commands users type run the command line, and nothing else.
  for m in ("main", "evaluate", "report", "compile_check", "hf"):
    assert layer(f"starpo_jax.{m}") == COMMAND
    assert (ROOT / "starpo_jax" / "cli" / f"{m}.py").is_file()


def test_the_environments_import_nothing_from_the_library():
  graph = imports("envs")
  wrong = [
    f"{m} imports {n}"
    for m, found in graph.items()
    for n in found
    if n == "starpo_jax" or n.startswith("starpo_jax.")
  ]
  assert not wrong, wrong
