"""StarPO-S filtering against RAGEN's selection rules, written as loops."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from starpo_jax.algo import filtering


def reference_keep(scores, cfg: filtering.FilterConfig) -> set[int]:
  """RAGEN's _select_top_groups in plain Python."""
  idx = list(range(len(scores)))
  if not cfg.include_zero:
    idx = [i for i in idx if abs(scores[i]) > 1e-10]
    if not idx:
      return set()
  s = {i: float(scores[i]) for i in idx}
  if cfg.strategy == "top_p":
    if cfg.value >= 1.0:
      return set(idx)
    if cfg.top_p_mode == "softmax":
      logits = [s[i] if cfg.largest else -s[i] for i in idx]
      top = max(logits)
      exps = [math.exp(v - top) for v in logits]
      probs = [e / sum(exps) for e in exps]
      ranked = sorted(range(len(idx)), key=lambda j: -probs[j])
      cumulative, k = 0.0, 0
      for j in ranked:
        cumulative += probs[j]
        k += 1
        if cumulative >= cfg.value:
          break
      return {idx[j] for j in ranked[:k]}
    ranked = sorted(idx, key=lambda i: -s[i] if cfg.largest else s[i])
    threshold = cfg.value * sum(s.values()) - cfg.selection_eps
    total, chosen = 0.0, []
    for i in ranked:
      if total >= threshold or s[i] <= 0:
        break
      total += s[i]
      chosen.append(i)
    return set(chosen) if total >= threshold else set()
  if cfg.strategy in ("top_k", "top_k_abs"):
    k = (
      int(cfg.value * len(scores))
      if cfg.strategy == "top_k"
      else int(cfg.value)
    )
    k = max(min(k, len(idx)), 1)
    ranked = sorted(idx, key=lambda i: -s[i] if cfg.largest else s[i])
    return set(ranked[:k])
  if cfg.largest:
    best = max(s.values())
    return {i for i in idx if s[i] >= best * cfg.value - 1e-10}
  best = min(s.values())
  return {i for i in idx if s[i] <= best / (cfg.value + 1e-10) + 1e-10}


CONFIGS = [
  filtering.FilterConfig(strategy="top_p", value=0.25),
  filtering.FilterConfig(strategy="top_p", value=0.6, largest=False),
  filtering.FilterConfig(strategy="top_p", value=0.5, top_p_mode="softmax"),
  filtering.FilterConfig(strategy="top_p", value=1.0, include_zero=False),
  filtering.FilterConfig(strategy="top_k", value=0.25),
  filtering.FilterConfig(strategy="top_k", value=0.5, largest=False),
  filtering.FilterConfig(strategy="top_k_abs", value=3),
  filtering.FilterConfig(strategy="min_p", value=0.5),
  filtering.FilterConfig(strategy="min_p", value=0.5, largest=False),
  filtering.FilterConfig(strategy="top_k", value=0.5, include_zero=False),
]


@pytest.mark.parametrize(
  "cfg", CONFIGS, ids=lambda c: f"{c.strategy}-{c.value}"
)
@settings(max_examples=40, deadline=None)
@given(
  scores=st.lists(
    st.one_of(st.just(0.0), st.floats(0.01, 5.0)),
    min_size=8,
    max_size=8,
    unique=True,
  )
)
def test_kept_groups_match_ragens_rules(cfg, scores):
  if cfg.strategy == "top_p" and cfg.top_p_mode == "linear":
    # Where a prefix sum lands on the threshold, float32 and float64 (or two
    # summation orders) may disagree: RAGEN's rule is ambiguous there.
    ranked = np.sort(scores)[:: -1 if cfg.largest else 1]
    threshold = cfg.value * sum(scores) - cfg.selection_eps
    assume(np.min(np.abs(np.cumsum(ranked) - threshold)) > 1e-4)
  got = np.asarray(filtering.keep_groups(jnp.asarray(scores, jnp.float32), cfg))
  assert set(np.flatnonzero(got)) == reference_keep(
    np.float32(scores).tolist(), cfg
  )


@pytest.mark.parametrize(
  "cfg", CONFIGS[4:8], ids=lambda c: f"{c.strategy}-{c.value}"
)
@settings(max_examples=25, deadline=None)
@given(
  data=st.data(),
  parts=st.lists(st.integers(1, 4), min_size=3, max_size=5),
)
def test_a_mixture_ranks_each_part_of_three_or_more_apart(cfg, data, parts):
  # Each part's own slice of the groups, from the third part on too.
  scores = data.draw(
    st.lists(
      st.floats(0.25, 5.0, width=32),
      min_size=sum(parts),
      max_size=sum(parts),
      unique=True,
    )
  )
  got = np.asarray(
    filtering.by_parts(jnp.asarray(scores, jnp.float32), cfg, tuple(parts))
  )
  want, start = set(), 0
  for n in parts:
    want |= {start + i for i in reference_keep(scores[start : start + n], cfg)}
    start += n
  assert set(np.flatnonzero(got)) == want


def test_three_parts_keep_their_own_best_group():
  cfg = filtering.FilterConfig(strategy="top_k_abs", value=1)
  scores = jnp.asarray([1.0, 2.0, 9.0, 8.0, 7.0, 3.0, 4.0, 5.0])
  kept = filtering.by_parts(scores, cfg, (2, 3, 3))
  assert np.flatnonzero(np.asarray(kept)).tolist() == [1, 2, 7]


def test_reward_std_is_the_unbiased_in_group_std():
  returns = np.asarray([1.0, 0.0, 0.5, 2.0, 2.0, 2.0], np.float32)
  got = filtering.group_scores(
    "reward_std", jnp.asarray(returns), None, None, 2
  )
  np.testing.assert_allclose(got, [np.std(returns[:3], ddof=1), 0.0], rtol=1e-6)


def test_other_metrics_average_over_the_group():
  lengths = jnp.asarray([2, 4, 6, 8])
  got = filtering.group_scores("length", None, lengths, None, 2)
  np.testing.assert_allclose(got, [3.0, 7.0])


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(metric="loss"), "metric"),
    (dict(strategy="best"), "strategy"),
    (dict(loss_scaling="cube"), "loss_scaling"),
    (dict(value=-1), "value"),
  ],
)
def test_bad_filter_settings_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    filtering.FilterConfig(**kwargs)
