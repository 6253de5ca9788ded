"""Attention kernels: one reference, and the fast path of each backend.

Training (a sequence attending causally to itself) never materialises the
``[B, N, T, T]`` scores on an accelerator:

- ``"cudnn"``: cuDNN's fused flash attention through
  ``jax.nn.dot_product_attention(implementation="cudnn")``, GPU only, for
  bfloat16 and float16 (cuDNN has no float32 kernel);
- ``"splash"``: the Pallas splash-attention kernel on TPU, forward and
  backward, run per device inside ``shard_map`` over the mesh of the
  computation being traced (``sharding.traced_for``);
- ``"blockwise"``: a flash-attention-style kernel in plain JAX
  (``blockwise.py``: query blocks that visit only the keys up to their
  end, a backward pass that recomputes the probabilities): the CPU's fast
  path, and the GPU's for float32;
- ``"xla"``: ``jax.nn.dot_product_attention``'s XLA version, the reference
  the others are tested against (it materialises the scores).

``"auto"`` (``ModelConfig.attention``) picks by the platform the computation
is compiled for, which is the mesh's when one is in use: compiling for a
TPU topology from a CPU host picks splash, not the CPU's kernel.

Decoding against a KV cache (``cached``) visits the cache in blocks, only
up to the furthest position in use, with an online softmax: the cost of a
step grows with the tokens so far, not with the cache's size.

A context window (``TurnWindow``, ``rollout.context_window``) hides a
multi-turn episode's older turns: a token sees the system prompt and the
last ``size`` turns, its own included. Training takes it as each token's
turn (the ``xla`` and ``blockwise`` kernels mask by it); decoding takes it
as a span of cache slots no query of the turn sees.

A ``Prefix`` is what sequences that begin alike share (``models.shared``):
the keys and values of their common prompt, computed once, which each
sequence's queries see before their own tokens (the ``xla`` and
``blockwise`` kernels).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from starpo_jax.models import blockwise
from starpo_jax.models.blockwise import ATTENTION_BLOCK, Prefix

IMPLEMENTATIONS = ("auto", "xla", "blockwise", "cudnn", "splash")

# cuDNN's fused attention exists for these compute dtypes only.
HALF = (jnp.dtype("bfloat16"), jnp.dtype("float16"))

# Mesh axes that shard the episode batch and the heads (sharding.py).
_BATCH_AXES = ("data", "fsdp")
_HEAD_AXIS = "tensor"


@struct.dataclass
class TurnWindow:
  """Which tokens of a multi-turn episode each token sees (causally): the
  system prompt (turn < 0) and the tokens of the last ``size`` turns, its
  own included.

  ``width > 0`` (``rollout.context_method="reprefill"``): each turn is
  scored as a prompt of its own, the system prompt and the visible turns
  at consecutive positions, at most ``width`` tokens, ``max_turns`` turns
  in all (``logprobs``); otherwise older turns are masked in place."""

  turns: jax.Array  # [B, T] int32 each token's turn; < 0: the system prompt
  size: int = struct.field(pytree_node=False)
  width: int = struct.field(pytree_node=False, default=0)
  max_turns: int = struct.field(pytree_node=False, default=0)

  def sees(self, query_turns: jax.Array, key_turns: jax.Array) -> jax.Array:
    """``[..., Q, S]`` bool: query ``[..., Q]`` sees key ``[..., S]``
    (causality apart)."""
    return blockwise.sees(query_turns, key_turns, self.size)

  def cut(self, length: int) -> TurnWindow:
    """The window of the sequence's first ``length`` tokens."""
    return self.replace(turns=self.turns[:, :length])


def platform() -> str:
  """The platform the current computation is for: the traced mesh's
  (``sharding.traced_for``), else JAX's default backend."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def choose(implementation: str, dtype: jnp.dtype, on: str) -> str:
  """The kernel that ``implementation`` means for ``dtype`` on platform
  ``on``.

  Raises:
    ValueError: for an unknown name, or a kernel the platform lacks.
  """
  dtype = jnp.dtype(dtype)
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"model: attention={implementation!r}; expected one of {IMPLEMENTATIONS}"
    )
  if implementation == "auto":
    if on == "tpu":
      return "splash"
    if on == "gpu" and dtype in HALF:
      return "cudnn"
    return "blockwise"
  if implementation == "cudnn" and (on != "gpu" or dtype not in HALF):
    raise ValueError(
      f"model: attention='cudnn' needs a GPU and bfloat16 or float16; this "
      f"is {on} with {dtype}"
    )
  if implementation == "splash" and on != "tpu":
    raise ValueError(f"model: attention='splash' needs a TPU; this is {on}")
  return implementation


def takes_prefix(implementation: str, dtype: jnp.dtype, on: str) -> bool:
  """Whether the kernel ``implementation`` picks for ``dtype`` on platform
  ``on`` attends after a shared ``Prefix`` (the plain-JAX kernels; the
  cuDNN and splash kernels compiled here have a causal mask only)."""
  return choose(implementation, dtype, on) in ("xla", "blockwise")


def causal(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  implementation: str = "auto",
  window: TurnWindow | None = None,
  prefix: Prefix | None = None,
) -> jax.Array:
  """Causal grouped-query attention of a sequence with itself.

  Args:
    q: ``[B, T, N, H]`` queries; ``k``, ``v``: ``[B, T, K, H]``, ``N`` a
      multiple of ``K``.
    implementation: one of ``IMPLEMENTATIONS``.
    window: older turns hidden as well. Only the ``xla`` and ``blockwise``
      kernels take one (``"auto"`` then picks ``blockwise``): the cuDNN and
      splash kernels compiled here have a causal mask only.
    prefix: keys and values every query sees first (the first
      ``prefix.length`` of them), a prompt shared with other sequences;
      the ``xla`` and ``blockwise`` kernels only, as for a window.

  Returns:
    ``[B, T, N, H]``.
  """
  if window is not None or prefix is not None:
    if implementation in ("cudnn", "splash"):
      what = "context window" if window is not None else "shared prefix"
      raise ValueError(
        f"model: attention={implementation!r} has no {what} "
        "(rollout.context_window, algo.share_prefix); use 'blockwise' or "
        "'xla'"
      )
    if implementation == "xla":
      return reference(q, k, v, window, prefix)
    turns = None if window is None else window.turns
    size = 0 if window is None else window.size
    return blockwise.attend(q, k, v, turns, size, prefix)
  kind = choose(implementation, q.dtype, platform())
  if kind == "xla":
    return reference(q, k, v)
  if kind == "cudnn":
    return jax.nn.dot_product_attention(
      q, k, v, is_causal=True, implementation="cudnn"
    )
  if kind == "splash":
    return splash(q, k, v)
  return blockwise.attend(q, k, v)


def reference(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  window: TurnWindow | None = None,
  prefix: Prefix | None = None,
) -> jax.Array:
  """Causal attention as XLA computes it, scores and all."""
  if prefix is None:
    mask = None
    if window is not None:
      mask = window.sees(window.turns, window.turns)[:, None]
    return jax.nn.dot_product_attention(
      q, k, v, mask=mask, is_causal=True, implementation="xla"
    )
  t = q.shape[1]
  mask = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  if window is not None:
    mask = mask & window.sees(window.turns, window.turns)
  mask = jnp.broadcast_to(mask, (q.shape[0], t, t))
  mask = jnp.concatenate([prefix.visible(q), mask], axis=2)[:, None]
  k = jnp.concatenate([prefix.k.astype(k.dtype), k], axis=1)
  v = jnp.concatenate([prefix.v.astype(v.dtype), v], axis=1)
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


# ---------------------------------------------------------------------------
# Splash attention (TPU)

SPLASH_BLOCKS = (512, 256, 128)


@functools.cache
def _splash_kernel(length: int, heads: int, interpret: bool):
  """The splash kernel of one sequence: ``[N, T, H]`` queries against
  ``[K, T, H]`` keys and values, causal, ``T`` a multiple of 128."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as kernel,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as mask,
  )

  block = next(b for b in SPLASH_BLOCKS if length % b == 0)
  sizes = kernel.BlockSizes(
    block_q=block,
    block_kv=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  causal_mask = mask.MultiHeadMask(
    [mask.CausalMask((length, length)) for _ in range(heads)]
  )
  # The kernel holds the mask's block tables as arrays: made concrete here,
  # not as tracers of whichever computation first asked (it is cached).
  with jax.ensure_compile_time_eval():
    return kernel.make_splash_mha(
      causal_mask,
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
    )


def splash(
  q: jax.Array, k: jax.Array, v: jax.Array, interpret: bool = False
) -> jax.Array:
  """Causal attention by the Pallas splash kernel, one sequence at a time.

  The sequence is padded to a multiple of 128 (padded keys come after every
  real query, so causality hides them). Under a mesh (``traced_for``) the
  kernel runs per device in ``shard_map``: sequences split over the batch
  axes, heads over ``tensor`` where it divides both head counts.
  ``interpret=True`` runs the kernel's Pallas program on any backend (for
  tests).
  """
  b, t, n, h = q.shape
  kv = k.shape[2]
  pad = -t % 128
  widen = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
  q, k, v = widen(q / math.sqrt(h)), widen(k), widen(v)
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = tuple(
    a for a in _BATCH_AXES if not mesh.empty and a in mesh.axis_names
  )
  batch_shards = math.prod(mesh.shape[a] for a in batch_axes)
  if batch_shards == 1 or b % batch_shards:
    batch_axes, batch_shards = (), 1
  head_shards = mesh.shape[_HEAD_AXIS] if _HEAD_AXIS in mesh.axis_names else 1
  head_axis = _HEAD_AXIS if n % head_shards == kv % head_shards == 0 else None
  local_heads = n // head_shards if head_axis else n

  def run(q, k, v):
    kernel = _splash_kernel(t + pad, local_heads, interpret)
    heads_first = lambda x: x.transpose(1, 0, 2)
    one = lambda q, k, v: kernel(
      heads_first(q), heads_first(k), heads_first(v)
    ).transpose(1, 0, 2)
    return jax.vmap(one)(q, k, v)

  if not mesh.empty and (batch_axes or head_axis):
    spec = P(batch_axes or None, None, head_axis, None)
    # The Pallas kernel's outputs carry no varying-axes annotation.
    run = jax.shard_map(
      run,
      mesh=mesh,
      in_specs=(spec, spec, spec),
      out_specs=spec,
      check_vma=False,
    )
  return run(q, k, v)[:, :t]


# ---------------------------------------------------------------------------
# Attention at some tokens


def at_tokens(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  at: jax.Array,
  window: TurnWindow | None = None,
  prefix: Prefix | None = None,
) -> jax.Array:
  """Causal attention of the tokens ``at [B, G]`` (indices into ``k``,
  ``v``: ``[B, T, K, H]``; their queries ``q [B, G, N, H]``) to the
  sequence (and by turn, ``window``; after ``prefix``'s keys, as
  ``causal``'s): ``Transformer.hidden``'s last layer with ``at``. Scores
  are ``[G, T]`` a sequence, in row groups that stay in cache on CPU (all
  rows at once elsewhere), each rematerialised: a backward keeps no
  scores. Returns ``[B, G, N, H]``."""
  (b, g, n), t = q.shape[:3], k.shape[1]
  turns = None if window is None else window.turns
  size = 0 if window is None else window.size
  p = 0 if prefix is None else prefix.k.shape[1]
  pk, pv, plen = (
    (None,) * 3 if prefix is None else (prefix.k, prefix.v, prefix.length)
  )

  @jax.checkpoint
  def one(x):
    # [G, N, H], [T, K, H] x2, [G], [T] | None, [P, K, H] x2 | None, []
    qr, kr, vr, ar, tr, pkr, pvr, plr = x
    qq = blockwise.head_major(qr, kr, vr)[0]
    kk, vv = blockwise.keys(kr, vr, pkr, pvr)
    s = jnp.einsum("KGQH,KSH->KGQS", qq, kk)
    ok = jnp.arange(t)[None, :] <= ar[:, None]
    if tr is not None:
      ok = ok & TurnWindow(tr, size).sees(tr[ar], tr)
    if p:
      seen = jnp.broadcast_to(jnp.arange(p) < plr, (g, p))
      ok = jnp.concatenate([seen, ok], axis=1)
    w = jax.nn.softmax(jnp.where(ok, s, -jnp.inf), axis=-1)
    o = jnp.einsum("KGQS,KSH->KGQH", w, vv)
    return o.transpose(2, 0, 1, 3).reshape(qr.shape).astype(v.dtype)

  group = blockwise.rows_per_step(b, n, g, p + t) if platform() == "cpu" else b
  return jax.lax.map(one, (q, k, v, at, turns, pk, pv, plen), batch_size=group)


# ---------------------------------------------------------------------------
# Decoding against a KV cache


# A turn's prefill attends to the cache's slots up to the furthest one in
# use, rounded up to a block of at least ATTENTION_BLOCK: at most this many
# prefix lengths, each a compiled branch (each costs about a tenth of a
# rollout's compile; a half-empty cache halves the prefill's attention).
MAX_PREFILL_LENGTHS = 2


def cached(
  q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, hidden=None
) -> jax.Array:
  """Grouped-query attention against a head-major cache, block by block.

  Keys are visited in blocks of ``ATTENTION_BLOCK`` slots with an online
  softmax, and only up to the furthest position any query needs: a cache
  sized for a whole episode costs only what is used so far, and no
  ``[queries, slots]`` score matrix is materialised.

  Args:
    q: ``[B, T, N, H]`` queries.
    k, v: ``[B, K, S, H]`` cached keys and values (``N`` a multiple of K).
    positions: ``[B, T]`` int32; query ``(b, t)`` attends to slots
      ``<= positions[b, t]``, except those in ``hidden``'s ``[B, 2]`` span
      ``[start, end)`` (turns outside a context window; None: none).

  Returns ``[B, T, N, H]``.
  """
  b, t, n, h = q.shape
  if t > 1 and platform() == "cpu":
    return _row_prefill(q, k, v, positions, hidden)
  kv, size = k.shape[1], k.shape[2]
  g = n // kv
  blk = min(ATTENTION_BLOCK, size)
  q = q.reshape(b, t, kv, g, h).astype(jnp.float32) / math.sqrt(h)
  needed = jnp.max(positions) + 1
  blocks = (jnp.minimum(needed, size) + blk - 1) // blk

  def body(carry):
    i, m, total, acc = carry
    start = jnp.minimum(i * blk, size - blk)
    kb = jax.lax.dynamic_slice_in_dim(k, start, blk, axis=2).astype(jnp.float32)
    vb = jax.lax.dynamic_slice_in_dim(v, start, blk, axis=2).astype(jnp.float32)
    # A last block that overlaps the previous one must not count twice.
    fresh = start + jnp.arange(blk) >= i * blk
    s = _block_scores(q, kb, start, positions, hidden)
    s = jnp.where(fresh, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - safe[..., None])
    scale = jnp.exp(jnp.where(jnp.isfinite(m), m - safe, -jnp.inf))
    total = total * scale + jnp.sum(p, axis=-1)
    acc = acc * scale[..., None] + _block_values(p, vb)
    return i + 1, m_new, total, acc

  init = (
    jnp.zeros((), jnp.int32),
    jnp.full((b, kv, g, t), -jnp.inf, jnp.float32),
    jnp.zeros((b, kv, g, t), jnp.float32),
    jnp.zeros((b, kv, g, t, h), jnp.float32),
  )
  # At most ceil(size / blk) blocks (the bound ``hlo_cost`` is given).
  with jax.named_scope("kv_blocks"):
    _, _, total, acc = jax.lax.while_loop(lambda c: c[0] < blocks, body, init)
  out = acc / jnp.maximum(total, 1e-30)[..., None]  # [B, K, G, T, H]
  out = jnp.moveaxis(out, 3, 1).reshape(b, t, n, h)
  return out.astype(v.dtype)


def _block_scores(
  q: jax.Array,
  kb: jax.Array,
  start: jax.Array,
  positions: jax.Array,
  hidden: jax.Array | None,
) -> jax.Array:
  """Scores ``[B, K, G, T, blk]`` of queries ``q [B, T, K, G, H]`` against
  the key block ``kb [B, K, blk, H]`` starting at slot ``start``; -inf
  past each query's position and in the row's ``hidden`` span."""
  t, blk = q.shape[1], kb.shape[2]
  if t == 1:
    # One query row: a fused multiply-reduce streams the block once (a
    # matmul of a few rows is far slower on CPU).
    s = jnp.sum(q[:, 0, :, :, None, :] * kb[:, :, None], axis=-1)
    s = s[:, :, :, None, :]  # [B, K, G, 1, blk]
  else:
    s = jnp.einsum("BTKGH,BKSH->BKGTS", q, kb)
  slots = start + jnp.arange(blk)
  ok = slots[None, None, :] <= positions[:, :, None]  # [B, T, blk]
  if hidden is not None:
    ok = ok & ~_in_span(slots[None, :], hidden)[:, None, :]
  return jnp.where(ok[:, None, None], s, -jnp.inf)


def _in_span(slots: jax.Array, span: jax.Array) -> jax.Array:
  """``slots [..., S]`` within ``span [..., 2]``'s ``[start, end)``."""
  return (slots >= span[..., :1]) & (slots < span[..., 1:])


def _block_values(p: jax.Array, vb: jax.Array) -> jax.Array:
  """The value block ``vb [B, K, blk, H]`` weighted by ``p [B, K, G, T,
  blk]``: ``[B, K, G, T, H]``."""
  if p.shape[3] == 1:
    return jnp.sum(p[:, :, :, 0, :, None] * vb[:, :, None], axis=-2)[
      :, :, :, None
    ]
  return jnp.einsum("BKGTS,BKSH->BKGTH", p, vb)


def _row_prefill(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  positions: jax.Array,
  hidden: jax.Array | None,
) -> jax.Array:
  """``cached_attention`` of several queries, one sequence at a time,
  against the cache's slots up to the furthest position any query needs
  (rounded up to a block: one compiled branch per length, ``lax.switch``).

  On CPU a sequence's scores against the cache stay in cache, which for
  a turn's prompt beats the block loop (that loop streams its blocks: the
  better choice for one query, and on accelerators).
  """
  size = k.shape[2]
  blk = max(ATTENTION_BLOCK, -(-size // MAX_PREFILL_LENGTHS))
  lengths = [min(size, end) for end in range(blk, size + blk, blk)]
  attend = [functools.partial(_prefill_upto, n) for n in lengths]
  if len(attend) == 1:
    return attend[0](q, k, v, positions, hidden)
  needed = jnp.minimum(jnp.max(positions) + 1, size)
  which = jnp.maximum(needed - 1, 0) // blk
  return jax.lax.switch(which, attend, q, k, v, positions, hidden)


def _prefill_upto(length, q, k, v, positions, hidden):
  """``_row_prefill`` against the first ``length`` slots of the cache."""
  t, n, h = q.shape[1:]
  kv = k.shape[1]

  def one(x):
    qr, kr, vr, pr, span = x  # [T, N, H], [K, S, H], [K, S, H], [T], [2]|None
    kr, vr = kr[:, :length].astype(jnp.float32), vr[:, :length]
    qq = qr.astype(jnp.float32).reshape(t, kv, n // kv, h).transpose(1, 2, 0, 3)
    s = jnp.einsum("KGTH,KSH->KGTS", qq / math.sqrt(h), kr)
    slots = jnp.arange(length)
    ok = slots[None, :] <= pr[:, None]
    if span is not None:
      ok = ok & ~_in_span(slots, span)[None, :]
    p = jax.nn.softmax(jnp.where(ok, s, -jnp.inf), axis=-1)
    o = jnp.einsum("KGTS,KSH->KGTH", p, vr.astype(jnp.float32))
    return o.transpose(2, 0, 1, 3).reshape(t, n, h).astype(v.dtype)

  return jax.lax.map(
    one,
    (q, k, v, positions, hidden),
    batch_size=blockwise.rows_per_step(q.shape[0], n, t, length),
  )
