"""Each attention kernel against XLA's reference, in values and in the
gradients with respect to queries, keys and values."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax import sharding
from starpo_jax.models import attention, blockwise


def _qkv(length, heads, kv_heads, head_dim=16, seed=0, rows=2):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(kq, (rows, length, heads, head_dim))
  k = jax.random.normal(kk, (rows, length, kv_heads, head_dim))
  v = jax.random.normal(kv, (rows, length, kv_heads, head_dim))
  return q, k, v


def _grads(fn, q, k, v):
  return jax.jit(
    jax.grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))), argnums=(0, 1, 2))
  )(q, k, v)


def _check(fn, q, k, v, tol):
  want = attention.reference(q, k, v)
  np.testing.assert_allclose(jax.jit(fn)(q, k, v), want, atol=tol, rtol=tol)
  for name, got, want in zip(
    "qkv",
    _grads(fn, q, k, v),
    _grads(attention.reference, q, k, v),
    strict=True,
  ):
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(
      got, want, atol=5 * tol * scale, rtol=5 * tol, err_msg=f"d{name}"
    )


@pytest.mark.parametrize(
  "length, heads, kv_heads",
  [(5, 4, 2), (128, 2, 2), (300, 6, 2), (16 * 128 + 40, 2, 1)],
)
def test_blockwise_equals_reference(length, heads, kv_heads):
  # 16 * 128 + 40 tokens need more than MAX_CAUSAL_BLOCKS blocks of 128:
  # the block size grows instead.
  _check(blockwise.attend, *_qkv(length, heads, kv_heads, seed=length), 2e-5)


@pytest.mark.parametrize("fit, group", [(1, None), (4, 3), (6, 6)])
def test_blockwise_rows_grouped_per_iteration_equal_reference(
  monkeypatch, fit, group
):
  # Scores for ``fit`` rows fit the budget; a group divides the six rows.
  length, heads = 24, 4
  monkeypatch.setattr(
    blockwise, "ROW_GROUP_BYTES", fit * 4 * heads * length * length
  )
  assert blockwise.rows_per_step(6, heads, length, length) == group
  _check(blockwise.attend, *_qkv(length, heads, 2, seed=3, rows=6), 2e-5)


@pytest.mark.parametrize("windowed, fit", [(False, 0), (True, 0), (True, 1)])
def test_attention_at_some_tokens_equals_the_reference_rows(
  monkeypatch, windowed, fit
):
  # Six rows of 40 tokens in turns of 8 (the first 5 the system prompt's);
  # each row's queries at 7 of its tokens, one twice and token 0 among
  # them. ``fit``: one row's scores fill a group (a loop of six).
  rows, length, heads, g = 6, 40, 4, 7
  if fit:
    monkeypatch.setattr(blockwise, "ROW_GROUP_BYTES", 4 * heads * g * length)
  q, k, v = _qkv(length, heads, 2, seed=11, rows=rows)
  rng = np.random.default_rng(0)
  at = np.sort(rng.integers(0, length, (rows, g)), axis=1)
  at[:, 0], at[:, 1] = 0, at[:, 2]
  at = jnp.asarray(at, jnp.int32)
  window = None
  if windowed:
    turn = jnp.where(jnp.arange(length) < 5, -1, (jnp.arange(length) - 5) // 8)
    window = attention.TurnWindow(jnp.broadcast_to(turn, (rows, length)), 2)
  take = jax.vmap(lambda x, i: x[i])
  got = lambda q, k, v: attention.at_tokens(take(q, at), k, v, at, window)
  want = lambda q, k, v: take(attention.reference(q, k, v, window), at)
  np.testing.assert_allclose(
    jax.jit(got)(q, k, v), want(q, k, v), atol=2e-5, rtol=2e-5
  )
  grads = zip("qkv", _grads(got, q, k, v), _grads(want, q, k, v), strict=True)
  for name, a, b in grads:
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"d{name}")


def test_splash_equals_reference_in_interpret_mode():
  # 200 tokens pad to 256 (two blocks of 128); 4 query heads share 2 kv heads.
  splash = functools.partial(attention.splash, interpret=True)
  _check(splash, *_qkv(200, 4, 2, head_dim=64, seed=1), 2e-5)


def test_splash_inside_shard_map_over_a_mesh():
  # A one-device mesh still takes the shard_map path when traced for it.
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  q, k, v = _qkv(130, 2, 1, head_dim=32, seed=2)
  splash = functools.partial(attention.splash, interpret=True)
  np.testing.assert_allclose(
    jax.jit(sharding.traced_for(mesh, splash))(q, k, v),
    attention.reference(q, k, v),
    atol=2e-5,
  )


@pytest.mark.parametrize(
  "implementation, dtype, on, want",
  [
    ("auto", "float32", "cpu", "blockwise"),
    ("auto", "bfloat16", "cpu", "blockwise"),
    ("auto", "bfloat16", "gpu", "cudnn"),
    ("auto", "float16", "gpu", "cudnn"),
    ("auto", "float32", "gpu", "blockwise"),
    ("auto", "float32", "tpu", "splash"),
    ("auto", "bfloat16", "tpu", "splash"),
    ("xla", "float32", "tpu", "xla"),
    ("blockwise", "bfloat16", "gpu", "blockwise"),
  ],
)
def test_choose_picks_the_platforms_kernel(implementation, dtype, on, want):
  assert attention.choose(implementation, jnp.dtype(dtype), on) == want


@pytest.mark.parametrize(
  "implementation, dtype, on, match",
  [
    ("cudnn", "float32", "gpu", "bfloat16 or float16; this is gpu"),
    ("cudnn", "bfloat16", "cpu", "needs a GPU"),
    ("splash", "bfloat16", "gpu", "needs a TPU; this is gpu"),
    ("flash", "bfloat16", "gpu", "attention='flash'"),
  ],
)
def test_choose_refuses_what_the_platform_lacks(
  implementation, dtype, on, match
):
  with pytest.raises(ValueError, match=match):
    attention.choose(implementation, jnp.dtype(dtype), on)


def test_platform_is_the_traced_meshs():
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  seen = []

  def fn(x):
    seen.append(attention.platform())
    return x

  jax.jit(sharding.traced_for(mesh, fn))(jnp.zeros(()))
  jax.jit(sharding.traced_for(None, fn))(jnp.ones(()))
  assert seen == [mesh.devices.flat[0].platform, jax.default_backend()]


def _cached_reference(q, k, v, positions, hidden):
  """NumPy: query (b, t) of head n sees the cache slots up to its
  position outside ``hidden[b]``'s [start, end), of kv head n // G."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, n, h = q.shape
  g = n // k.shape[1]
  out = np.zeros_like(q)
  for row in range(b):
    for i in range(t):
      slots = np.arange(k.shape[2])
      ok = slots <= positions[row, i]
      ok &= ~((slots >= hidden[row, 0]) & (slots < hidden[row, 1]))
      for head in range(n):
        s = k[row, head // g] @ q[row, i, head] / np.sqrt(h)
        p = np.where(ok, np.exp(s - s[ok].max()), 0.0)
        out[row, i, head] = (p / p.sum()) @ v[row, head // g]
  return out


@pytest.mark.parametrize("furthest", [40, 200, 299])
def test_cached_prefill_sees_exactly_its_slots_whatever_prefix_it_takes(
  furthest,
):
  # A 300-slot cache is attended in prefixes of 150 or 300 slots, the
  # shorter one when it holds the furthest query; row 1 hides slots 3 to 9.
  rows, t, heads, kv_heads, h, size = 3, 5, 4, 2, 16, 300
  kq, kk, kv = jax.random.split(jax.random.key(furthest), 3)
  q = jax.random.normal(kq, (rows, t, heads, h))
  k = jax.random.normal(kk, (rows, kv_heads, size, h))
  v = jax.random.normal(kv, (rows, kv_heads, size, h))
  positions = np.array([[furthest - 4 + i for i in range(t)]] * rows)
  positions[2] = np.arange(t) + 10
  hidden = np.array([[0, 0], [3, 10], [0, 0]])
  got = jax.jit(attention.cached)(
    q, k, v, jnp.asarray(positions, jnp.int32), jnp.asarray(hidden)
  )
  want = _cached_reference(q, k, v, positions, hidden)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
