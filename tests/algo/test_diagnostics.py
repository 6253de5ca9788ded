"""RAGEN-2's collapse diagnostics against NumPy written from its formulas,
and the cross-scoring matrix against sequences built by hand."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from starpo_jax.agent.rollout import Trajectory
from starpo_jax.algo import diagnostics, logprobs

G, K = 4, 3  # groups, episodes per group
B = G * K


def reference(ll_sum: np.ndarray, n: np.ndarray) -> dict[str, float]:
  """MI, entropies, retrieval and z-score from a ``[B, G]`` matrix, written
  from RAGEN-2's definitions (rows with no reply token left out)."""
  own = np.arange(ll_sum.shape[0]) // K
  rows = np.array([n[i, own[i]] > 0 for i in range(len(own))])
  out = {}
  for suffix, ll in (("", ll_sum / np.maximum(n, 1)), ("_seq", ll_sum)):
    ll, o = ll[rows].astype(np.float64), own[rows]
    matched = ll[np.arange(len(o)), o]
    top = ll.max(1, keepdims=True)
    marginal = (
      np.log(np.exp(ll - top).sum(1)) + top[:, 0] - math.log(ll.shape[1])
    )
    out[f"mi{suffix}"] = float(np.mean(matched - marginal))
    out[f"conditional_entropy{suffix}"] = float(-np.mean(matched))
    out[f"marginal_entropy{suffix}"] = float(-np.mean(marginal))
    if not suffix:
      out["mi_zscore"] = float(
        np.mean(matched - marginal) / (marginal.std() + 1e-3)
      )
      for k in (1, 2, 4, 8):
        # Best first; ties to the lower prompt index (a stable sort).
        order = np.argsort(-ll, axis=1, kind="stable")[:, :k]
        out[f"retrieval@{k}"] = float(
          np.mean([o[i] in order[i] for i in range(len(o))])
        )
        out[f"retrieval_chance@{k}"] = min(k, G) / G
  out["mi_bound"] = math.log(G)
  return out


def check(ll_sum: np.ndarray, n: np.ndarray) -> dict[str, float]:
  got = jax.jit(diagnostics.collapse_metrics, static_argnums=2)(
    jnp.asarray(ll_sum, jnp.float32), jnp.asarray(n, jnp.int32), K
  )
  want = reference(ll_sum, n)
  for name, value in want.items():
    # The z-score divides by a spread that float32 resolves coarsely.
    rtol = 1e-3 if name == "mi_zscore" else 1e-4
    np.testing.assert_allclose(
      float(got[f"collapse/{name}"]), value, rtol=rtol, atol=1e-4, err_msg=name
    )
  return want


def lengths(seed: int = 0) -> np.ndarray:
  """Reply lengths, one per row, the same under every prompt."""
  r = np.random.default_rng(seed).integers(1, 9, size=B)
  return np.repeat(r[:, None], G, axis=1)


def test_separable_replies_retrieve_their_prompt_and_reach_the_bound():
  n = lengths()
  own = np.arange(B) // K
  per_token = np.where(np.arange(G)[None] == own[:, None], -0.1, -9.0)
  m = check(per_token * n, n)
  assert m["retrieval@1"] == 1.0
  assert m["mi"] == pytest.approx(math.log(G), abs=1e-2)


def test_collapsed_replies_carry_no_information_and_retrieve_at_chance():
  n = lengths(1)
  rows = np.random.default_rng(1).normal(-2.0, 0.5, size=(B, 1))
  m = check(np.repeat(rows, G, axis=1) * n, n)
  assert m["mi"] == pytest.approx(0.0, abs=1e-6)
  assert m["conditional_entropy"] == pytest.approx(m["marginal_entropy"])
  # Every prompt ties: the lowest index wins, right only for group 0.
  assert m["retrieval@1"] == pytest.approx(1 / G)
  assert m["retrieval@2"] == pytest.approx(2 / G)


def test_in_between_and_a_row_without_reply():
  rng = np.random.default_rng(2)
  n = lengths(2)
  n[5] = 0  # an episode that generated nothing in its first turn
  own = np.arange(B) // K
  per_token = rng.normal(-2.0, 1.0, size=(B, G)) + 0.8 * (
    np.arange(G)[None] == own[:, None]
  )
  m = check(per_token * n, n)
  assert 0.0 < m["mi"] < math.log(G)
  assert 1 / G < m["retrieval@1"] < 1.0


@settings(max_examples=40, deadline=None)
@given(
  hnp.arrays(
    np.float32,
    (B, G),
    elements=st.floats(-30, 0, width=32),
  ),
  st.integers(0, 2**31 - 1),
)
def test_any_matrix_matches_the_reference(per_token, seed):
  n = lengths(seed % 1000)
  # Round so that ties between prompts happen and are resolved alike.
  check(np.round(per_token, 0) * n, n)


# --- The cross-scoring matrix ------------------------------------------------

L = 11
PROMPTS = (4, 7, 5)  # each group's first prompt length
REPLIES = (1, 5, 3, 2, 4, 1)  # first reply lengths; 7 + 5 passes L


def trajectory() -> Trajectory:
  """Two episodes per group: the group's prompt, a first reply, then a
  second turn's observation and reply, then padding."""
  rng = np.random.default_rng(3)
  groups, size = len(PROMPTS), 2
  tokens = np.zeros((groups * size, L), np.int32)
  mask = np.zeros_like(tokens, bool)
  turn = np.full_like(tokens, -1)
  for i, r in enumerate(REPLIES):
    p = PROMPTS[i // size]
    prompt = np.random.default_rng(100 + i // size).integers(1, 50, p)
    tokens[i, :p] = prompt
    tokens[i, p : p + r] = rng.integers(1, 50, r)
    mask[i, p : p + r] = True
    turn[i, : p + r] = 0
    rest = L - p - r
    tokens[i, p + r :] = rng.integers(1, 50, rest)
    mask[i, p + r + rest // 2 :] = True  # the second reply
    turn[i, p + r :] = 1
  fields = {f: None for f in Trajectory.__dataclass_fields__}
  fields.update(
    tokens=jnp.asarray(tokens),
    loss_mask=jnp.asarray(mask),
    turn_ids=jnp.asarray(turn),
  )
  return Trajectory(**fields)


W = np.linspace(0.1, 1.3, L)


def toy_logp(tokens, positions):
  """A stand-in model: the log-probability of the token at p depends on
  every token before it and on where they sit."""
  prefix = jnp.cumsum(tokens * W[: tokens.shape[1]], axis=1)
  before = jnp.take_along_axis(prefix, jnp.maximum(positions - 1, 0), 1)
  at = jnp.take_along_axis(tokens, positions, 1)
  return jnp.sin(0.37 * before + at) - 2.0


def toy_logp_np(seq: np.ndarray, p: int) -> float:
  return math.sin(0.37 * float(np.sum(seq[:p] * W[:p])) + seq[p]) - 2.0


@pytest.mark.parametrize(
  ("context", "budget"), [(64, 0), (9, 0), (64, 2 * L), (9, 9)]
)
def test_cross_loglik_scores_each_reply_after_each_prompt(context, budget):
  # With a token budget each prompt scores the replies a few rows at a time.
  logp = logprobs.in_micro_batches(toy_logp, budget)
  traj = trajectory()
  total, n = jax.jit(diagnostics.cross_loglik, static_argnums=(0, 2, 3, 4))(
    logp, traj, len(PROMPTS), 8, context
  )
  tokens = np.asarray(traj.tokens)
  first = np.asarray(traj.loss_mask) & (np.asarray(traj.turn_ids) == 0)
  first[:, context:] = False  # what the context holds of a reply
  for i in range(len(REPLIES)):
    reply = tokens[i][first[i]]
    for j, p in enumerate(PROMPTS):
      # Cut where the context ends.
      seq = np.concatenate([tokens[2 * j, :p], reply])[: min(L, context)]
      want = sum(toy_logp_np(seq, t) for t in range(p, len(seq)))
      assert int(n[i, j]) == len(seq) - p
      np.testing.assert_allclose(float(total[i, j]), want, rtol=1e-5, atol=1e-5)


def test_collapse_is_skipped_off_its_steps_and_logged_only_when_computed():
  traj = trajectory()
  fields = {f: getattr(traj, f) for f in Trajectory.__dataclass_fields__}
  played = jnp.ones((len(REPLIES), 2), bool)
  thought = played.at[:, 1].set(False)
  fields.update(
    turn_valid=played,
    turn_format_ok=played,
    turn_played=played,
    turn_thought=thought,
  )
  traj = Trajectory(**fields)
  traced = chex.assert_max_traces(
    lambda *args: diagnostics.collapse(*args), n=1
  )
  run = jax.jit(traced, static_argnums=(0, 2, 3, 4))
  off = run(toy_logp, traj, len(PROMPTS), 8, L, jnp.asarray(False))
  on = run(toy_logp, traj, len(PROMPTS), 8, L, jnp.asarray(True))
  assert float(off["collapse/computed"]) == 0.0
  assert float(on["collapse/computed"]) == 1.0
  assert float(on["collapse/mi_bound"]) == pytest.approx(math.log(3))
  host = lambda m: {k: float(v) for k, v in m.items()}
  assert "collapse/mi" not in diagnostics.logged(host(off))
  assert "collapse/first_turn_valid_rate" in diagnostics.logged(host(off))
  assert float(off["collapse/valid_thinking_rate"]) == 0.5
  assert "collapse/mi" in diagnostics.logged(host(on))
