"""Test settings: the CPU platform, quick compiles (LLVM's optimizations
off, a compilation cache the workers share), and the order of files for
workers.

Workers take whole files in collection order, so a long file collected
last runs alone at the end. Starting with the longest files (measured on
2 cores: 1.8 to 1.0 minutes each) packs the two workers evenly.
pytest-xdist would otherwise order files by their number of tests, which
put the TPU compile (a minute, 8 tests) last.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Tests run on the CPU. libtpu (a test dependency, for compiling to TPU
# topologies) would otherwise probe for TPU chips in every process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiling for a TPU topology touches no chip, but libtpu takes a lock
# file per process: two workers (or a worker and its subprocess) would
# otherwise refuse each other.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# The suite runs one worker per core. OpenMP pools (torch's, OpenBLAS's
# under NumPy) would start a thread per core in every worker, and their
# threads spin after each parallel region on the core the other worker
# needs: one thread each. Four test files on two workers, alternated
# twice on a 2-core Xeon: 151.7 and 160.1 s with it, 158.8 and 168.9 s
# without.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests' programs are tiny: compiling them takes far longer than
# running them. Without LLVM's optimizations the suite's CPU time falls by
# about a quarter (tests/algo/test_compaction.py alone: 200 to 140 CPU seconds);
# XLA's older fusion emitters compile the small bandit step in 2.9 s
# instead of 5.2. Only the tests' own processes and their subprocesses
# compile this way; the TPU compiles (tests/cli/test_compile_check.py) drop
# these flags.
os.environ["XLA_FLAGS"] = " ".join(
  [
    os.environ.get("XLA_FLAGS", ""),
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
  ]
).strip()
# Many tests compile the same small step (a run and its resumed copy, a
# fixture's run and a test's): JAX's persistent cache compiles each program
# once per session. Made by the first process (pytest-xdist's controller,
# whose workers inherit it) and removed when it exits, so no session reads
# another's programs. Tracing is not cached: the tests that a second call
# does not retrace still see every trace.
# Every program, however quick to compile: the workers' many small ones
# (an environment's reset, an evaluation's sampler) recur across files.
# The tests' summed time on a 2-core AMD EPYC, one run each: 1,658 s with
# JAX's default (programs compiling in under a second not kept), 1,508 s.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="starpo-jax-tests-xla-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

LONGEST_FIRST = (
  "tests/test_sharding.py",
  "tests/agent/test_mixture.py",
  "tests/models/test_gguf.py",
  "tests/agent/test_rollout.py",
  "tests/run/test_lora_train.py",
  "tests/run/test_train.py",
  "tests/algo/test_compaction.py",
  "tests/agent/test_rollout_savings.py",
  "tests/algo/test_sft.py",
  "tests/cli/test_compile_check.py",
  "tests/algo/test_step.py",
  "tests/agent/test_codec.py",
  "tests/envs/test_host.py",
  "tests/agent/test_context_window.py",
)


def _machine() -> str:
  from benchmarks.common import cpu_model

  return f"CPU: {cpu_model()}, {os.cpu_count()} cores"


def pytest_report_header(config):
  return _machine()


def pytest_terminal_summary(terminalreporter):
  # Also under -q, which drops the header: a failure names its machine
  # (float rounding differs between CPU kinds).
  terminalreporter.write_line(_machine())


def pytest_configure(config):
  # ``--dist loadfile`` keeps the order below only without xdist's own
  # reordering (on by default since pytest-xdist 3.6).
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  def rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FIRST:
      return LONGEST_FIRST.index(path)
    return len(LONGEST_FIRST)

  items.sort(key=rank)
