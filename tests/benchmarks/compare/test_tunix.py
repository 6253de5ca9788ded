"""The Tunix peer computes what our model does (its Qwen2, loaded by its
own loader from the checkpoint we write, gives our logits) and the side by
side trains on both sides. Runs only where Tunix's environment exists (it
cannot share ours)."""

from __future__ import annotations

import os

import pytest

from benchmarks.compare.tunix import check

pytestmark = pytest.mark.skipif(
  not os.path.exists(check.python()),
  reason=f"no Tunix environment at {check.python()} (make it as "
  "benchmarks/compare/tunix/requirements.txt says, or set TUNIX_PYTHON)",
)


def test_tunix_qwen2_gives_our_logits(tmp_path):
  assert check.logit_gap(str(tmp_path)) < check.TOLERANCE


def test_the_logit_check_sees_one_perturbed_weight(tmp_path):
  assert check.logit_gap(str(tmp_path), perturb=True) > 1e-2


def test_side_by_side_smoke_trains_on_both_sides(tmp_path):
  """The peers suite at its smoke size: both frameworks play the warm
  policy's episodes, generate tokens and train, and the rows compare
  them; the JAX step does not recompile."""
  from benchmarks.compare.tunix import side_by_side

  result = side_by_side.measure(
    "smoke", str(tmp_path), repeats=1, sft_steps=side_by_side.SFT_STEPS["smoke"]
  )
  ours, theirs = result["jax"], result["tunix"]
  assert not ours["recompiled"]
  for side in (ours, theirs):
    assert side["iterations_s"] > 0 and side["tokens"] > 0, result
  # The same policy under the same rules plays as many turns on each side
  # (a reply that does not stop where ours does spends Tunix's budget).
  assert ours["turns"] == theirs["turns"] == 2, result
  rows = side_by_side.rows(result)
  assert [r["metric"] for r in rows] == ["iterations/s", "generated tokens/s"]
  assert rows[0]["ratio"] == ours["iterations_s"] / theirs["iterations_s"]
