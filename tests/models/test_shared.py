"""A batch whose rows begin alike, each shared prefix computed once
(``models.shared``), against the same rows run whole: hidden states and
every parameter's gradient, with 1 to 3 layers, remat on and off, LoRA on
and off, units that share their prompt and one that shares nothing; the
attention after a prefix against XLA's attention over the joined keys;
the shared lengths against a plain-Python reference."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax.models import attention, blockwise, presets, transformer
from starpo_jax.models.config import LoraConfig
from starpo_jax.models.shared import Shared, common_length
from tests.helpers import assert_close_at_scale, fuzz

VOCAB = 61
UNIT = 3


def batch(shared: list[int], length: int = 40, seed: int = 0):
  """Rows in units of ``UNIT`` whose first ``shared[u]`` tokens are alike,
  and where each row's scored tokens are (after every shared prompt)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, (UNIT * len(shared), length))
  for u, n in enumerate(shared):
    tokens[u * UNIT : (u + 1) * UNIT, :n] = tokens[u * UNIT, :n]
    # Row 1 of a unit that shares n tokens differs at token n.
    tokens[u * UNIT + 1, n] = (tokens[u * UNIT, n] + 1) % VOCAB
  first = max(shared) + 1
  at = np.sort(rng.integers(first, length, (len(tokens), 6)), axis=1)
  at[:, 0] = first
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(at, jnp.int32)


def model(layers: int, remat: str, lora: bool):
  cfg = presets.preset(
    "tiny", vocab_size=VOCAB, num_layers=layers, remat=remat
  ).replace(lora=LoraConfig(rank=4, alpha=8.0) if lora else None)
  m = transformer.create(cfg, seed=layers)
  if lora:
    # New adapters add nothing (B = 0): give them something to add.
    graphdef, params = nnx.split(m)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [
      x + 0.1 * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys, strict=True)
    ]
    m = nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))
  return m


def outputs(m, tokens, at, shared):
  graphdef, params = nnx.split(m)

  def loss(params):
    h = nnx.merge(graphdef, params).hidden(tokens, at=at, shared=shared)[0]
    return jnp.sum(jnp.sin(3 * h)), h

  (_, h), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return h, grads


def assert_same(got, want):
  h_got, g_got = got
  h_want, g_want = want
  assert_close_at_scale(h_got, h_want, err_msg="hidden states")
  flat = jax.tree_util.tree_leaves_with_path
  for (path, a), (_, b) in zip(flat(g_got), flat(g_want), strict=True):
    assert_close_at_scale(a, b, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize(
  "layers, remat, lora",
  [(1, "none", False), (2, "full", True), (3, "none", True)],
)
def test_shared_prefixes_give_the_plain_batchs_states_and_gradients(
  layers, remat, lora
):
  # Three units: two share 13 and 7 tokens, one shares none (its rows
  # differ at token 0), in a prefix of 16 slots.
  tokens, at = batch([13, 7, 0])
  length = common_length(tokens, UNIT, at[:, 0] - 1, 16)
  np.testing.assert_array_equal(length, [13, 7, 0])
  m = model(layers, remat, lora)
  shared = Shared(length, unit=UNIT, prefix=16, suffix=tokens.shape[1])
  assert_same(outputs(m, tokens, at, shared), outputs(m, tokens, at, None))


def test_rows_read_their_own_tokens_past_a_suffix_shorter_than_the_rest():
  # Each row's own tokens need length - 13 slots after a 13-token prefix;
  # the suffix holds exactly those, not a whole row.
  tokens, at = batch([13, 13], seed=2)
  m = model(2, "none", False)
  length = common_length(tokens, UNIT, at[:, 0] - 1, 16)
  shared = Shared(length, unit=UNIT, prefix=16, suffix=tokens.shape[1] - 13)
  assert_same(outputs(m, tokens, at, shared), outputs(m, tokens, at, None))


def test_a_shared_call_needs_the_tokens_it_returns_and_no_cache():
  tokens, at = batch([5])
  m = model(1, "none", False)
  shared = Shared(jnp.array([5]), unit=UNIT, prefix=8, suffix=40)
  with pytest.raises(ValueError, match="needs the tokens `at`"):
    m.hidden(tokens, shared=shared)
  with pytest.raises(ValueError, match="no cache"):
    m.hidden(tokens, m.init_cache(UNIT, 64), at=at, shared=shared)


def _joined(q, k, v, prefix):
  """XLA's attention over the prefix's keys then the row's, the mask
  written out: the reference ``blockwise`` is held to."""
  t, p = q.shape[1], prefix.k.shape[1]
  own = np.tril(np.ones((t, t), bool))
  seen = np.arange(p)[None, :] < np.asarray(prefix.length)[:, None, None]
  mask = np.concatenate(
    [
      np.broadcast_to(seen, (q.shape[0], t, p)),
      np.broadcast_to(own, (q.shape[0], t, t)),
    ],
    axis=2,
  )
  keys = jnp.concatenate([prefix.k, k], axis=1)
  values = jnp.concatenate([prefix.v, v], axis=1)
  return jax.nn.dot_product_attention(
    q, keys, values, mask=jnp.asarray(mask)[:, None], implementation="xla"
  )


@pytest.mark.parametrize("kernel", ["blockwise", "xla"])
def test_attention_after_a_prefix_equals_attention_over_the_joined_keys(
  kernel,
):
  # 140 own tokens (two query blocks), a prefix of 20 slots of which rows
  # see 20, 9 and 0.
  keys = jax.random.split(jax.random.key(3), 5)
  q = jax.random.normal(keys[0], (3, 140, 4, 16))
  k, v = (jax.random.normal(x, (3, 140, 2, 16)) for x in keys[1:3])
  pk, pv = (jax.random.normal(x, (3, 20, 2, 16)) for x in keys[3:5])
  length = jnp.array([20, 9, 0], jnp.int32)

  def run(fn):
    def loss(q, k, v, pk, pv):
      prefix = blockwise.Prefix(pk, pv, length)
      return jnp.sum(jnp.sin(fn(q, k, v, prefix)))

    args = (q, k, v, pk, pv)
    out = fn(q, k, v, blockwise.Prefix(pk, pv, length))
    return out, jax.grad(loss, argnums=range(5))(*args)

  got = run(lambda q, k, v, p: attention.causal(q, k, v, kernel, prefix=p))
  want = run(_joined)
  assert_close_at_scale(got[0], want[0], rtol=1e-5)
  names = ("q", "k", "v", "pk", "pv")
  for name, a, b in zip(names, got[1], want[1], strict=True):
    assert_close_at_scale(a, b, rtol=1e-5, err_msg=name)


def test_the_fused_kernels_refuse_a_prefix():
  q = jnp.zeros((1, 8, 2, 16))
  prefix = blockwise.Prefix(
    jnp.zeros((1, 4, 2, 16)), jnp.zeros((1, 4, 2, 16)), jnp.array([4])
  )
  for kernel in ("cudnn", "splash"):
    with pytest.raises(ValueError, match=f"{kernel!r} has no shared prefix"):
      attention.causal(q, q, q, kernel, prefix=prefix)


def _common_reference(rows: list[list[int]], before: list[int], most: int):
  n = 0
  while n < len(rows[0]) and all(r[n] == rows[0][n] for r in rows):
    n += 1
  return max(0, min(n, min(before), most))


@fuzz(150)
@hypothesis.given(
  data=st.data(),
  units=st.integers(1, 3),
  unit=st.integers(1, 4),
  length=st.integers(1, 9),
)
def test_common_length_is_the_longest_common_prefix_capped(
  data, units, unit, length
):
  rows = data.draw(
    st.lists(
      st.lists(st.integers(0, 2), min_size=length, max_size=length),
      min_size=units * unit,
      max_size=units * unit,
    )
  )
  before = data.draw(
    st.lists(st.integers(0, 12), min_size=len(rows), max_size=len(rows))
  )
  most = data.draw(st.integers(0, 12))
  got = common_length(
    jnp.asarray(rows, jnp.int32), unit, jnp.asarray(before), most
  )
  want = [
    _common_reference(
      rows[u * unit : (u + 1) * unit], before[u * unit : (u + 1) * unit], most
    )
    for u in range(units)
  ]
  np.testing.assert_array_equal(got, want)
