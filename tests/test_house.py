"""The house rules a reader relies on: the library's subpackages import
one way (``models`` <- ``agent`` <- ``algo`` <- ``run`` <- ``cli``), with
no import cycle; the environments import nothing from the library; only
the environment protocol (``envs.batch``) and assembly reach its
adapters, and nothing else asks which kind of environment it holds; no
code reads the raw config past the parser; no file in the library, the
environments, the benchmarks or the experiments is longer than 600 lines,
and no function longer than 60; the benchmarks and experiments import
nothing from the tests; no package of the repository takes part in an
import cycle, and ``benchmarks/`` keeps its top level to a few files. Each
check is shown to catch a planted violation."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ["starpo_jax", "envs", "benchmarks", "experiments"]
# Every Python package of the repository, for the import-cycle check.
PACKAGES = [*FOLDERS, "configs", "reference", "tests"]
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 600


def python_files(folder: str) -> list[pathlib.Path]:
  """The project's Python files under ``folder``: not those of a virtual
  environment or anything else in a hidden folder (Tunix's peer keeps
  its own at ``benchmarks/compare/tunix/.venv``)."""
  return [
    path
    for path in sorted((ROOT / folder).rglob("*.py"))
    if not any(
      part.startswith(".") for part in path.relative_to(ROOT).parts[:-1]
    )
  ]


def sources(folder: str):
  for path in python_files(folder):
    yield path.relative_to(ROOT), path.read_text()


def test_the_checks_read_the_projects_files_not_a_virtual_environments(
  tmp_path, monkeypatch
):
  # A peer's virtual environment (built as its requirements say) holds
  # thousands of files that break every rule: they are not the project's.
  for name in ("benchmarks/a.py", "benchmarks/peer/.venv/lib/b.py"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("import tests\n")
  real = ROOT
  monkeypatch.setitem(globals(), "ROOT", tmp_path)
  assert python_files("benchmarks") == [tmp_path / "benchmarks" / "a.py"]
  monkeypatch.undo()
  assert real / "benchmarks" / "compare" / "run.py" in python_files(
    "benchmarks"
  )


def long_functions(path, text: str, limit: int) -> list[str]:
  return [
    f"{path}:{node.lineno} {node.name} ({n} lines)"
    for node in ast.walk(ast.parse(text))
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    and (n := node.end_lineno - node.lineno + 1) > limit
  ]


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_is_longer_than_60_lines(folder):
  long = []
  for path, text in sources(folder):
    long += long_functions(path, text, MAX_FUNCTION_LINES)
  assert not long, long
  planted = "def f():\n" + "  x = 1\n" * MAX_FUNCTION_LINES
  assert long_functions("planted.py", planted, MAX_FUNCTION_LINES)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_file_is_longer_than_600_lines(folder):
  long = [
    f"{path} ({n} lines)"
    for path, text in sources(folder)
    if (n := text.count("\n")) > MAX_FILE_LINES
  ]
  assert not long, long


MAX_PARAMETERS = 8


def many_parameters(path, text: str, limit: int) -> list[str]:
  """Functions taking more than ``limit`` parameters (``self`` and
  ``cls`` not counted): a sign that some belong together in a struct."""
  found = []
  for node in ast.walk(ast.parse(text)):
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
      continue
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    n = len([x for x in names if x not in ("self", "cls")])
    if n > limit:
      found.append(f"{path}:{node.lineno} {node.name} ({n} parameters)")
  return found


def test_no_function_in_the_library_takes_more_than_8_parameters():
  many = []
  for path, text in sources("starpo_jax"):
    many += many_parameters(path, text, MAX_PARAMETERS)
  assert not many, many
  names = [f"a{i}" for i in range(MAX_PARAMETERS)]
  at_limit = f"def f(self, {', '.join(names)}): pass\n"
  assert not many_parameters("planted.py", at_limit, MAX_PARAMETERS)
  past = f"def f(*, {', '.join([*names, 'one_more'])}): pass\n"
  assert many_parameters("planted.py", past, MAX_PARAMETERS)


# A figure measured on one machine goes stale in a docstring: figures live
# in the docs' JSON, where the command that measured them writes them.
TIMING = re.compile(
  r"\b\d[\d,.]*\s*(?:ms|µs|s|seconds?|min(?:utes?)?|hours?)\b(?![-/\w])"
  r"|\b\d[\d.]*x (?:faster|slower)\b|\bGFLOP/s\b"
)


def timed_docstrings(path, text: str) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(text)):
    if isinstance(
      node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    ):
      doc = ast.get_docstring(node) or ""
      found += [
        f"{path}:{getattr(node, 'lineno', 1)} {m[0]!r}"
        for m in TIMING.finditer(doc)
      ]
  return found


@pytest.mark.parametrize("folder", ["starpo_jax", "envs"])
def test_no_docstring_states_a_timing(folder):
  timed = []
  for path, text in sources(folder):
    timed += timed_docstrings(path, text)
  assert not timed, timed
  for planted in ("took 43 s", "about 3x faster", "0.3 ms a call"):
    assert timed_docstrings("planted.py", f'"""It {planted}."""\n'), planted
  for kept in ("timeout_s: the longest", "5 turns", "3 x 128 tokens"):
    assert not timed_docstrings("planted.py", f'"""{kept}."""\n'), kept


@pytest.mark.parametrize("folder", ["benchmarks", "experiments"])
def test_benchmarks_import_nothing_from_tests(folder):
  imports = []
  for path in python_files(folder):
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
  for path in python_files(folder):
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


def test_no_package_of_the_repository_takes_part_in_an_import_cycle():
  # Imports inside functions count: hiding one there breaks no cycle.
  graph = {}
  for folder in PACKAGES:
    graph.update(imports(folder))
  assert {"benchmarks.compare.run", "experiments.doc_tables"} <= graph.keys()
  assert cycle(graph) is None, " -> ".join(cycle(graph))
  # A runner and a peer that import each other, one of them inside a
  # function, are found.
  looped = {
    **graph,
    "benchmarks.compare.rows": {"benchmarks.compare.tunix.side_by_side"},
  }
  assert cycle(looped)


# The top level of ``benchmarks/`` holds its map and what every purpose
# shares; each benchmark lives in the folder of its purpose.
MAX_BENCHMARK_TOP_FILES = 6


def test_the_benchmarks_are_sorted_by_purpose():
  top = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file())
  assert len(top) <= MAX_BENCHMARK_TOP_FILES, top
  assert "README.md" in top
  folders = {p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir()}
  assert {"compare", "profiling", "components"} <= folders


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


# The environment protocol's adapters and host bridge: reached through
# ``envs.batched`` by everything but the protocol itself and assembly.
PROTOCOL = "envs.batch"
BRIDGE = ("envs.batch.host", "envs.batch.slots", "envs.batch.vmap")
MAY_REACH_BRIDGE = ("envs.batch", "starpo_jax.run.assembly")


def reaches_bridge(graph: dict[str, set[str]]) -> list[str]:
  return [
    f"{m} imports {n}"
    for m, found in graph.items()
    for n in found
    if n.startswith(BRIDGE)
    and not any(m == a or m.startswith(a + ".") for a in MAY_REACH_BRIDGE)
  ]


def test_only_the_protocol_and_assembly_reach_the_environment_adapters():
  wrong = []
  for folder in FOLDERS:
    wrong += reaches_bridge(imports(folder))
  assert not wrong, wrong
  assert reaches_bridge({"starpo_jax.agent.rollout": {"envs.batch.host"}})


# The classes that tell the kinds of environment apart.
KINDS = {
  "Env",
  "TextEnv",
  "HostSpec",
  "HostEnv",
  "HostEnvironment",
  "VmapEnv",
  "BatchEnv",
}


def kind_checks(path, text: str) -> list[str]:
  """``isinstance(x, K)`` with K an environment kind (or a tuple or union
  naming one)."""
  out = []
  for node in ast.walk(ast.parse(text)):
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id == "isinstance"
      and len(node.args) == 2
    ):
      named = {
        n.attr if isinstance(n, ast.Attribute) else n.id
        for n in ast.walk(node.args[1])
        if isinstance(n, ast.Name | ast.Attribute)
      }
      if named & KINDS:
        out.append(f"{path}:{node.lineno}")
  return out


def test_nothing_outside_the_protocol_asks_which_kind_of_environment():
  wrong = []
  for folder in FOLDERS:
    for path, text in sources(folder):
      if not str(path).startswith("envs/batch/"):
        wrong += kind_checks(path, text)
  assert not wrong, wrong
  planted = "def f(env):\n  return isinstance(env, envs.HostEnvironment)\n"
  assert kind_checks("planted.py", planted)


# What only the parser (``run/assembly/config.py``, ``settings.py``) may
# do with a config file's ConfigDict: everything past it reads the typed
# RunConfig.
RAW_CONFIG = {"copy_and_resolve_references", "unlocked", "to_dict", "lock"}
PARSERS = ("starpo_jax/run/assembly/config.py", "starpo_jax/settings.py")


def raw_config_reads(path, text: str) -> list[str]:
  """A ConfigDict named or imported (``config_flags``, which defines the
  command line's --config, aside), a ConfigDict method called, or a
  section read with ``.get`` (``c.train.get("profile", "")``)."""
  out = []
  for node in ast.walk(ast.parse(text)):
    line = f"{path}:{getattr(node, 'lineno', 0)}"
    if isinstance(node, ast.Attribute) and node.attr == "ConfigDict":
      out.append(f"{line} ConfigDict")
    elif isinstance(node, ast.Import) and any(
      a.name == "ml_collections" for a in node.names
    ):
      out.append(f"{line} import ml_collections")
    elif (
      isinstance(node, ast.ImportFrom)
      and node.module == "ml_collections"
      and any(a.name != "config_flags" for a in node.names)
    ):
      out.append(f"{line} from ml_collections")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      owner = node.func.value
      if node.func.attr in RAW_CONFIG:
        out.append(f"{line} .{node.func.attr}()")
      elif (
        node.func.attr == "get"
        and isinstance(owner, ast.Attribute)
        and owner.attr in sections()
      ):
        out.append(f"{line} .{owner.attr}.get()")
  return out


def sections() -> set[str]:
  from starpo_jax.run.sections import SECTIONS

  return set(SECTIONS)


def test_no_code_reads_the_raw_config_after_parsing():
  wrong = []
  for path, text in sources("starpo_jax"):
    if str(path) not in PARSERS:
      wrong += raw_config_reads(path, text)
  assert not wrong, wrong
  planted = 'def f(c):\n  return c.train.get("profile", "")\n'
  assert raw_config_reads("planted.py", planted)
  planted = "def f(c):\n  return c.copy_and_resolve_references()\n"
  assert raw_config_reads("planted.py", planted)
