"""Test settings: the CPU platform, and the order of files for workers.

Workers take whole files in collection order, so a long file collected
last runs alone at the end. Starting with the longest files (measured on
2 cores: about 6, 5, 5, 2.5 and 2 minutes) packs the two workers evenly.
"""

from __future__ import annotations

import os

# Tests run on the CPU. libtpu (a test dependency, for compiling to TPU
# topologies) would otherwise probe for TPU chips in every process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiling for a TPU topology touches no chip, but libtpu takes a lock
# file per process: two workers (or a worker and its subprocess) would
# otherwise refuse each other.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

LONGEST_FIRST = (
  "tests/test_sharding.py",
  "tests/test_train.py",
  "tests/test_rollout.py",
  "tests/test_benchmark_run.py",
  "tests/test_step.py",
  "tests/test_lora_train.py",
)


def pytest_collection_modifyitems(config, items):
  def rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FIRST:
      return LONGEST_FIRST.index(path)
    return len(LONGEST_FIRST)

  items.sort(key=rank)
