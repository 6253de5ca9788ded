"""Test ordering for ``pytest -n 2 --dist loadfile``.

Workers take whole files in collection order, so a long file collected
last runs alone at the end. Starting with the longest files (measured on
2 cores: about 6, 5, 5, 2.5 and 2 minutes) packs the two workers evenly.
"""

from __future__ import annotations

LONGEST_FIRST = (
  "tests/test_sharding.py",
  "tests/test_train.py",
  "tests/test_rollout.py",
  "tests/test_benchmark_run.py",
  "tests/test_step.py",
)


def pytest_collection_modifyitems(config, items):
  def rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FIRST:
      return LONGEST_FIRST.index(path)
    return len(LONGEST_FIRST)

  items.sort(key=rank)
