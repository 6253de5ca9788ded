"""The Tunix peer computes what our model does: its Qwen2, loaded by its
own loader from the checkpoint we write, gives our logits. Runs only
where Tunix's environment exists (it cannot share ours)."""

from __future__ import annotations

import os

import pytest

from benchmarks.peers.tunix import check

pytestmark = pytest.mark.skipif(
  not os.path.exists(check.python()),
  reason=f"no Tunix environment at {check.python()} (make it as "
  "benchmarks/peers/tunix/requirements.txt says, or set TUNIX_PYTHON)",
)


def test_tunix_qwen2_gives_our_logits(tmp_path):
  assert check.logit_gap(str(tmp_path)) < check.TOLERANCE


def test_the_logit_check_sees_one_perturbed_weight(tmp_path):
  assert check.logit_gap(str(tmp_path), perturb=True) > 1e-2
