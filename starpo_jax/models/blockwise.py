"""Causal attention in plain JAX without the ``[T, T]`` scores of a whole
batch: the training kernel of the CPU, and of the GPU in float32
(``attention.causal`` picks it).

One sequence at a time (its score blocks stay in cache), queries in
blocks that attend only to the keys up to their end (the masked half is
never computed), and a backward pass that recomputes the probabilities
from the saved log-normalisers rather than storing them. A ``TurnWindow``
masks each block by the tokens' turns as well.

A sequence may also attend to a ``Prefix``: keys and values before its
own, of a prompt several sequences share and that was computed once
(``models.shared``). Its queries see the prefix's first ``length`` slots,
then their own sequence causally; the gradients of the prefix's keys and
values come back per sequence, and the caller's broadcast sums them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct

ATTENTION_BLOCK = 128

# Causal attention over a whole sequence runs at most this many query blocks.
MAX_CAUSAL_BLOCKS = 16

# Sequences attended together, one group per iteration of a row loop: as
# many as keep the group's float32 scores within this many bytes. Short
# sequences then share an iteration (a loop of tiny steps is bound by its
# per-operation overhead), long ones keep one each (their scores in cache).
ROW_GROUP_BYTES = 2 << 20


@struct.dataclass
class Prefix:
  """Keys and values each sequence's queries see before its own tokens:
  a prompt the sequences share, computed once. The first ``length`` of its
  ``P`` slots are real; the rest are never seen."""

  k: jax.Array  # [B, P, K, H]
  v: jax.Array  # [B, P, K, H]
  length: jax.Array  # [B] int32

  def visible(self, query: jax.Array) -> jax.Array:
    """``[B, Q, P]`` bool: which prefix slots each of ``Q`` queries sees."""
    slots = jnp.arange(self.k.shape[1])
    ok = slots[None, :] < self.length[:, None]
    return jnp.broadcast_to(ok[:, None, :], (*query.shape[:2], slots.shape[0]))


def rows_per_step(rows: int, heads: int, queries: int, keys: int):
  """How many of ``rows`` sequences one iteration of a row loop takes
  (``lax.map``'s ``batch_size``; None: one): a divisor of ``rows``, as
  ``lax.map`` runs a remainder as a second, slow loop of its own."""
  most = min(rows, ROW_GROUP_BYTES // (4 * heads * queries * keys))
  group = max((d for d in range(1, most + 1) if rows % d == 0), default=1)
  return group if group > 1 else None


def attend(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  turns: jax.Array | None = None,
  size: int = 0,
  prefix: Prefix | None = None,
) -> jax.Array:
  """Causal grouped-query attention ``[B, T, N, H]`` of ``q [B, T, N, H]``
  over ``k``, ``v`` ``[B, T, K, H]``, hiding keys of turns older than
  ``size`` by ``turns [B, T]`` (a ``TurnWindow``'s; None: none), after
  the keys and values of ``prefix`` (None: none)."""
  if prefix is None:
    return _row_attention(q, k, v, turns, size, None, None, None)
  return _row_attention(q, k, v, turns, size, prefix.k, prefix.v, prefix.length)


def blocks(t: int) -> list[tuple[int, int]]:
  """The query blocks ``[start, end)`` of a sequence of ``t`` tokens."""
  blk = max(ATTENTION_BLOCK, -(-t // MAX_CAUSAL_BLOCKS))
  return [(s, min(s + blk, t)) for s in range(0, t, blk)]


def head_major(q, k, v):
  """One sequence: ``[T, N, H]`` -> scaled float32 ``[K, G, T, H]``, and
  ``[T, K, H]`` -> ``[K, T, H]``."""
  t, n, h = q.shape
  kv = k.shape[1]
  qq = q.astype(jnp.float32).reshape(t, kv, n // kv, h).transpose(1, 2, 0, 3)
  qq = qq / math.sqrt(h)
  kk = k.astype(jnp.float32).transpose(1, 0, 2)
  vv = v.astype(jnp.float32).transpose(1, 0, 2)
  return qq, kk, vv


def sees(query_turns, key_turns, size: int) -> jax.Array:
  """``[..., Q, S]`` bool: a query of turn ``query_turns [..., Q]`` sees a
  key of turn ``key_turns [..., S]`` within a window of ``size`` turns
  (the system prompt, turn < 0, always)."""
  q, k = query_turns[..., :, None], key_turns[..., None, :]
  return (k < 0) | (k > q - size)


def _visible(start, end, turns, size, p, plen) -> jax.Array:
  """``[end - start, p + end]`` bool: which keys (``p`` prefix slots, the
  first ``plen`` real, then the sequence's own up to ``end``) the queries
  ``start:end`` of one sequence see."""
  ok = jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]
  if turns is not None:
    ok = ok & sees(turns[start:end], turns[:end], size)
  if not p:
    return ok
  before = jnp.broadcast_to(jnp.arange(p) < plen, (end - start, p))
  return jnp.concatenate([before, ok], axis=1)


def keys(k, v, kp, vp):
  """One sequence's keys and values, head-major ``[K, P + T, H]``, the
  prefix's first."""
  kk = k.astype(jnp.float32).transpose(1, 0, 2)
  vv = v.astype(jnp.float32).transpose(1, 0, 2)
  if kp is None:
    return kk, vv
  kp = kp.astype(jnp.float32).transpose(1, 0, 2)
  vp = vp.astype(jnp.float32).transpose(1, 0, 2)
  return jnp.concatenate([kp, kk], axis=1), jnp.concatenate([vp, vv], axis=1)


def _row_forward(q, k, v, turns, size, kp, vp, plen):
  """One sequence's attention ``[T, N, H]`` and log-normalisers
  ``[K, G, T]``."""
  t, n, h = q.shape
  p = 0 if kp is None else kp.shape[0]
  qq = head_major(q, k, v)[0]
  kk, vv = keys(k, v, kp, vp)
  outs, lses = [], []
  for start, end in blocks(t):
    s = jnp.einsum("KGTH,KSH->KGTS", qq[:, :, start:end], kk[:, : p + end])
    s = jnp.where(_visible(start, end, turns, size, p, plen), s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    outs.append(jnp.einsum("KGTS,KSH->KGTH", e, vv[:, : p + end]) / total)
    lses.append((m + jnp.log(total))[..., 0])
  o = jnp.concatenate(outs, axis=2).transpose(2, 0, 1, 3).reshape(t, n, h)
  return o, jnp.concatenate(lses, axis=2)


def _row_backward(q, k, v, turns, size, prefix, outputs):
  """Gradients of one sequence's attention (and of its prefix's keys and
  values), probabilities recomputed. ``prefix``: the prefix's keys, values
  and length (``kp``, ``vp``, ``plen``, as ``_row_forward`` takes them);
  ``outputs``: the forward's output and log-sum-exp, and the output's
  gradient."""
  kp, vp, plen = prefix
  o, lse, do = outputs
  t, n, h = q.shape
  kv = k.shape[1]
  p = 0 if kp is None else kp.shape[0]
  qq = head_major(q, k, v)[0]
  kk, vv = keys(k, v, kp, vp)
  heads = lambda x: x.astype(jnp.float32).reshape(t, kv, n // kv, h)
  do_ = heads(do).transpose(1, 2, 0, 3)  # [K, G, T, H]
  delta = jnp.sum(do_ * heads(o).transpose(1, 2, 0, 3), axis=-1)  # [K, G, T]
  # dk and dv are summed over queries as [K, H, S]: the query block's
  # q and do (H wide) are the dots' transposed operands, not the [.., S]
  # probabilities (XLA:CPU transposes a left operand contracted over its
  # leading axes in memory).
  width = p + t
  dq, dk, dv = [], jnp.zeros((kv, h, width)), jnp.zeros((kv, h, width))
  for start, end in blocks(t):
    qb, dob = qq[:, :, start:end], do_[:, :, start:end]
    s = jnp.einsum("KGTH,KSH->KGTS", qb, kk[:, : p + end])
    ok = _visible(start, end, turns, size, p, plen)
    prob = jnp.where(ok, jnp.exp(s - lse[:, :, start:end, None]), 0.0)
    pad = ((0, 0), (0, 0), (0, t - end))
    dv = dv + jnp.pad(jnp.einsum("KGTH,KGTS->KHS", dob, prob), pad)
    dp = jnp.einsum("KGTH,KSH->KGTS", dob, vv[:, : p + end])
    ds = prob * (dp - delta[:, :, start:end, None])
    dq.append(jnp.einsum("KGTS,KSH->KGTH", ds, kk[:, : p + end]) / math.sqrt(h))
    dk = dk + jnp.pad(jnp.einsum("KGTH,KGTS->KHS", qb, ds), pad)
  dq = jnp.concatenate(dq, axis=2).transpose(2, 0, 1, 3).reshape(t, n, h)
  dk, dv = dk.transpose(2, 0, 1), dv.transpose(2, 0, 1)  # [P + T, K, H]
  out = (dq.astype(q.dtype), dk[p:].astype(k.dtype), dv[p:].astype(v.dtype))
  if kp is None:
    return (*out, None, None)
  return (*out, dk[:p].astype(kp.dtype), dv[:p].astype(vp.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _row_attention(q, k, v, turns, size, kp, vp, plen):
  """``turns [B, T]`` (or None) and ``size``: a ``TurnWindow``'s; ``kp``,
  ``vp``, ``plen``: a ``Prefix``'s (or None)."""
  return _row_attention_fwd(q, k, v, turns, size, kp, vp, plen)[0]


def _group(q, k, kp):
  b, t, n = q.shape[:3]
  keys = t + (0 if kp is None else kp.shape[1])
  return rows_per_step(b, n, t, keys)


def _row_attention_fwd(q, k, v, turns, size, kp, vp, plen):
  o, lse = jax.lax.map(
    lambda x: _row_forward(*x[:3], x[3], size, *x[4:]),
    (q, k, v, turns, kp, vp, plen),
    batch_size=_group(q, k, kp),
  )
  o = o.astype(v.dtype)
  return o, (q, k, v, turns, kp, vp, plen, o, lse)


def _row_attention_bwd(size, res, do):
  q, k, v, turns, kp, vp, plen, o, lse = res
  dq, dk, dv, dkp, dvp = jax.lax.map(
    lambda x: _row_backward(*x[:4], size, x[7:], x[4:7]),
    (q, k, v, turns, o, lse, do, kp, vp, plen),
    batch_size=_group(q, k, kp),
  )
  return dq, dk, dv, None, dkp, dvp, None


_row_attention.defvjp(_row_attention_fwd, _row_attention_bwd)
