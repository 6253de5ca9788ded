"""Decoder-only transformer for the Qwen2 and Llama families, in Flax NNX.

One code path serves a tiny model trained from scratch on a CPU and a 7B
checkpoint on a TPU pod: RMSNorm, rotary embeddings, grouped-query
attention, a SwiGLU MLP, tied or untied embeddings, q/k/v biases (Qwen2) and
an optional scalar value head (PPO's critic).

Layers are stacked along a leading ``layers`` axis and run with a scan, so a
deep model compiles one layer, not all of them. Parameters carry
logical axis names (``logical.py``); no mesh axis is named here.

The KV cache is functional: ``logits, cache = model(tokens, cache)``. Each
sequence of a batch sits at its own position: a call writes its ``T`` tokens
at ``cache.length[b]`` onwards and advances ``length`` by ``num_new[b]``
(the chunk's real tokens; the rest of the chunk is padding that later writes
overwrite and no real token attends to).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx, struct

from starpo_jax.models import attention, head, lora
from starpo_jax.models import logical as ax
from starpo_jax.models.config import REMAT_POLICIES, ModelConfig, validate
from starpo_jax.models.dense import dense
from starpo_jax.models.rope import inverse_frequencies, rope
from starpo_jax.models.shared import Shared


@struct.dataclass
class KVCache:
  """Keys and values of every layer, and each sequence's length.

  One array per layer, head-major: single-token decoding streams each
  head's keys once, and the per-token writes happen in place (a stacked
  ``[layers, ...]`` cache copies its layer slices every step on CPU).
  """

  k: tuple[jax.Array, ...]  # per layer [B, kv_heads, S, head_dim]
  v: tuple[jax.Array, ...]  # per layer [B, kv_heads, S, head_dim]
  length: jax.Array  # [B] int32, tokens written per sequence
  # [B, 2] int32: a span [start, end) of slots that calls do not attend to
  # (turns outside a context window, ``rollout.context_window``); None: all.
  hidden: jax.Array | None = None
  # [B] int32: how far the rotary positions of new tokens trail their
  # slots (the hidden span's length, ``context_method="reprefill"``), so
  # that the visible turns follow the system prompt; None: slot = position.
  shift: jax.Array | None = None

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, size: int) -> KVCache:
    shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
    dtype = jnp.dtype(cfg.dtype)
    layers = range(cfg.num_layers)
    return cls(
      k=tuple(jnp.zeros(shape, dtype) for _ in layers),
      v=tuple(jnp.zeros(shape, dtype) for _ in layers),
      length=jnp.zeros((batch,), jnp.int32),
    )

  @property
  def size(self) -> int:
    return self.k[0].shape[2]

  def broadcast(self, batch: int) -> KVCache:
    """A batch-1 cache repeated ``batch`` times (a shared prompt)."""
    grow = lambda x: jnp.broadcast_to(x, (batch, *x.shape[1:]))
    return KVCache(
      k=tuple(grow(x) for x in self.k),
      v=tuple(grow(x) for x in self.v),
      length=jnp.broadcast_to(self.length, (batch,)),
      hidden=None if self.hidden is None else grow(self.hidden),
      shift=None if self.shift is None else grow(self.shift),
    )


def _param(
  rngs: nnx.Rngs,
  init: Any,
  shape: tuple[int, ...],
  axes: tuple[str, ...],
  dtype: str,
) -> nnx.Param:
  init = nnx.with_partitioning(init, axes)
  return nnx.Param(init(rngs.params(), shape, jnp.dtype(dtype)))


_normal = nnx.initializers.normal(0.02)
_zeros = nnx.initializers.zeros_init()
_ones = nnx.initializers.ones_init()


class RMSNorm(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    self.scale = _param(
      rngs, _ones, (cfg.hidden_size,), (ax.EMBED,), cfg.param_dtype
    )
    self.eps = cfg.rms_norm_eps

  def __call__(self, x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(
      jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps
    )
    return self.scale[...].astype(x.dtype) * xf.astype(x.dtype)


def _weight(param: Any, dtype: Any) -> Any:
  """A projection's weight in the compute dtype. A QLoRA weight (qwix's
  quantized array, not an ``nnx.Param``) is passed as it is: qwix computes
  with it, and finds which weight it is by its identity."""
  if not isinstance(param, nnx.Variable):
    return param
  w = param[...]
  return w if w.dtype == dtype else w.astype(dtype)


def _take(x: jax.Array, at: jax.Array) -> jax.Array:
  """``x [B, T, ...]`` at the tokens ``at [B, G]``: ``[B, G, ...]``."""
  return jax.vmap(lambda row, i: row[i])(x, at)


def _einsum(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x @ w`` with JAX's own gradient rule."""
  return jnp.einsum("BTD,DF->BTF", x, w)


class Attention(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    d, h, kv, hd, p = (
      cfg.hidden_size,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.head_dim,
      cfg.param_dtype,
    )
    self.q = _param(
      rngs, _normal, (d, h, hd), (ax.EMBED, ax.HEADS, ax.HEAD_DIM), p
    )
    self.k = _param(
      rngs, _normal, (d, kv, hd), (ax.EMBED, ax.KV, ax.HEAD_DIM), p
    )
    self.v = _param(
      rngs, _normal, (d, kv, hd), (ax.EMBED, ax.KV, ax.HEAD_DIM), p
    )
    self.o = _param(
      rngs, _normal, (h, hd, d), (ax.HEADS, ax.HEAD_DIM, ax.EMBED), p
    )
    if cfg.qkv_bias:
      self.q_bias = _param(rngs, _zeros, (h, hd), (ax.HEADS, ax.HEAD_DIM), p)
      self.k_bias = _param(rngs, _zeros, (kv, hd), (ax.KV, ax.HEAD_DIM), p)
      self.v_bias = _param(rngs, _zeros, (kv, hd), (ax.KV, ax.HEAD_DIM), p)
    self.qkv_bias = cfg.qkv_bias
    self.dtype = jnp.dtype(cfg.dtype)
    self.implementation = cfg.attention

  def project(self, x: jax.Array, name: str) -> jax.Array:
    w = _weight(getattr(self, name), self.dtype)
    y = jnp.einsum("BTD,DNH->BTNH", x, w)
    if self.qkv_bias:
      y = y + getattr(self, f"{name}_bias")[...].astype(self.dtype)
    return y

  def __call__(
    self,
    x: jax.Array,  # [B, T, D]
    positions: jax.Array,  # [B, T]
    inv_freq: jax.Array,
    cache: tuple[jax.Array, ...] | None,
    window: attention.TurnWindow | None = None,
    at: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """``cache``: the layer's keys, values, the cache's hidden span and
    its positions' shift (``KVCache``); ``window``: the turns each token
    sees (uncached calls). ``positions`` are the tokens' slots. ``at [B,
    G]``: only these tokens' queries and outputs (every token's keys and
    values): ``[B, G, D]``."""
    rotary = positions
    if cache is not None and cache[3] is not None:
      rotary = positions - cache[3][:, None]
    xq, q_rotary, q_slots = x, rotary, positions
    if at is not None:
      xq, q_rotary, q_slots = (_take(a, at) for a in (x, rotary, positions))
    q = rope(self.project(xq, "q"), q_rotary, inv_freq)
    k = rope(self.project(x, "k"), rotary, inv_freq)
    v = self.project(x, "v")
    if cache is None:
      if at is None:
        out = attention.causal(q, k, v, self.implementation, window)
      else:
        out = attention.at_tokens(q, k, v, at, window)
      new_cache = None
    else:
      k_cache, v_cache, hidden, _ = cache
      rows = jnp.arange(k.shape[0])[:, None]
      # Chunk padding past the cache's end is dropped, never clamped onto
      # earlier slots.
      write = lambda c, new: c.at[rows, :, positions, :].set(
        new.astype(c.dtype), mode="drop"
      )
      k_cache, v_cache = write(k_cache, k), write(v_cache, v)
      out = attention.cached(q, k_cache, v_cache, q_slots, hidden)
      new_cache = (k_cache, v_cache)
    return self.output(out), new_cache

  def output(self, out: jax.Array) -> jax.Array:
    """The heads' outputs ``[B, T, N, H]`` projected back, ``[B, T, D]``."""
    return jnp.einsum("BTNH,NHD->BTD", out, _weight(self.o, self.dtype))

  def after_prefix(
    self,
    xp: jax.Array,  # [U, P, D]
    xs: jax.Array,  # [B, S, D]
    shared: Shared,
    inv_freq: jax.Array,
    at: jax.Array | None = None,
  ) -> tuple[jax.Array | None, jax.Array]:
    """Attention of each unit's prefix ``xp`` (causal) and of each row's
    own tokens ``xs`` (after its unit's prefix): ``[U, P, D]`` and ``[B,
    S, D]``. ``at [B, G]``: the rows' outputs at these of their own
    tokens only, ``[B, G, D]``, and none of the prefix's."""
    pos_p, pos_s = shared.positions()
    keys = lambda x, pos: rope(self.project(x, "k"), pos, inv_freq)
    kp, ks = keys(xp, pos_p), keys(xs, pos_s)
    vp, vs = self.project(xp, "v"), self.project(xs, "v")
    prefix = shared.attended(kp, vp)
    if at is not None:
      q = rope(self.project(_take(xs, at), "q"), _take(pos_s, at), inv_freq)
      out = attention.at_tokens(q, ks, vs, at, prefix=prefix)
      return None, self.output(out)
    qp = rope(self.project(xp, "q"), pos_p, inv_freq)
    qs = rope(self.project(xs, "q"), pos_s, inv_freq)
    op = attention.causal(qp, kp, vp, self.implementation)
    os = attention.causal(qs, ks, vs, self.implementation, prefix=prefix)
    return self.output(op), self.output(os)


class MLP(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    d, f, p = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.gate = _param(rngs, _normal, (d, f), (ax.EMBED, ax.MLP), p)
    self.up = _param(rngs, _normal, (d, f), (ax.EMBED, ax.MLP), p)
    self.down = _param(rngs, _normal, (f, d), (ax.MLP, ax.EMBED), p)
    self.dtype = jnp.dtype(cfg.dtype)
    # LoRA's qwix intercepts the einsums it adapts; inside ``dense``'s own
    # gradient rule its adapters would get none. Adapted layers keep JAX's.
    self.project = dense if cfg.lora is None else _einsum

  def __call__(self, x: jax.Array) -> jax.Array:
    w = lambda p: _weight(p, self.dtype)
    gate = self.project(x, w(self.gate))
    up = self.project(x, w(self.up))
    return self.project(jax.nn.silu(gate) * up, w(self.down))


class Block(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    self.attn_norm = RMSNorm(cfg, rngs)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg, rngs)
    self.mlp = MLP(cfg, rngs)

  def __call__(
    self, x, positions, inv_freq, cache, window=None, at=None, shared=None
  ):
    """``at [B, G]``: the block's output at these tokens only, ``[B, G,
    D]`` (``Attention``). With ``shared``, ``x`` is a unit's prefix and the
    rows' own tokens (``after_prefix``; ``positions`` unused): through
    ``__call__``, which qwix's LoRA intercepts, not beside it."""
    if shared is not None:
      return self.after_prefix(*x, shared, inv_freq, at), None
    h, cache = self.attn(
      self.attn_norm(x), positions, inv_freq, cache, window, at
    )
    if at is not None:
      x = _take(x, at)
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), cache

  def after_prefix(self, xp, xs, shared, inv_freq, at=None):
    """The block over each unit's prefix ``xp [U, P, D]`` and each row's
    own tokens ``xs [B, S, D]`` (``Attention.after_prefix``); with ``at``
    the rows' outputs there only and no prefix (None)."""
    hp, hs = self.attn.after_prefix(
      self.attn_norm(xp), self.attn_norm(xs), shared, inv_freq, at
    )
    if at is not None:
      xs = _take(xs, at)
    residual = lambda x, h: x + h + self.mlp(self.mlp_norm(x + h))
    return None if hp is None else residual(xp, hp), residual(xs, hs)


def quantize_weights(cfg: ModelConfig, weights: dict[str, Any]) -> Any:
  """``weights`` (a pure dict of the plain model's parameters, floating
  point) as a QLoRA model of ``cfg`` holds them: each layer's targeted
  projections quantized as qwix quantizes them when it adapts a layer."""
  inv_freq = inverse_frequencies(cfg)
  with nnx.use_eager_sharding(False):
    block = nnx.eval_shape(
      lambda: lora.adapt(Block(cfg, nnx.Rngs(0)), cfg, inv_freq, nnx.Rngs(0))
    )
  layer = lambda w: qwix.quantize_params(w, block)
  return {**weights, "layers": jax.vmap(layer)(weights["layers"])}


class Transformer(nnx.Module):
  """The decoder. ``model(tokens, cache)`` -> ``(logits, cache)``."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    cfg = validate(cfg)
    self.cfg = cfg
    p = cfg.param_dtype
    self.embed = _param(
      rngs, _normal, (cfg.vocab_size, cfg.hidden_size), (ax.VOCAB, ax.EMBED), p
    )

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(
      in_axes=(0,),
      out_axes=0,
      transform_metadata={nnx.PARTITION_NAME: ax.LAYERS},
    )
    def make_layers(rngs: nnx.Rngs) -> Block:
      block = Block(cfg, rngs)
      if cfg.lora is None:
        return block
      return lora.adapt(block, cfg, inverse_frequencies(cfg), rngs)

    self.layers = make_layers(rngs)
    self.final_norm = RMSNorm(cfg, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = _param(
        rngs,
        _normal,
        (cfg.hidden_size, cfg.vocab_size),
        (ax.EMBED, ax.VOCAB),
        p,
      )
    if cfg.value_head:
      self.value_w = _param(rngs, _zeros, (cfg.hidden_size,), (ax.EMBED,), p)
      self.value_b = _param(rngs, _zeros, (), (), p)

  # Its output is a function of the tokens and the cache alone, so the
  # rollout may prefill a prompt episodes share once (``rollout.Policy``).
  depends_on_row = False

  def init_cache(self, batch: int, size: int) -> KVCache:
    return KVCache.init(self.cfg, batch, size)

  def hidden(
    self,
    tokens: jax.Array,
    cache: KVCache | None = None,
    num_new: jax.Array | None = None,
    window: attention.TurnWindow | None = None,
    at: jax.Array | None = None,
    shared: Shared | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    """Final-norm hidden states ``[B, T, D]`` and the advanced cache.

    Args:
      tokens: int32 ``[B, T]``.
      cache: without one, the tokens start at position 0 with causal
        attention among themselves.
      num_new: int32 ``[B]``, how many of the ``T`` tokens are real (the
        rest is padding); defaults to ``T``. Tokens past the cache's end
        are dropped.
      window: without a cache, the turns each token sees (a context
        window); with one, ``cache.hidden`` says which slots are unseen.
      at: int32 ``[B, G]``, indices into ``T``: the hidden states of
        these tokens only, ``[B, G, D]``. The last layer then computes
        every token's keys and values but its queries, attention output
        and MLP only at ``at`` (what a log-probability or a prefill's
        next token needs: of a two-layer model, about 40% of a forward).
      shared: the prompts the rows share (``models.shared``), each computed
        once; uncached, without a window, and with ``at`` only (each at a
        row's own token).
    """
    if window is not None and cache is not None:
      raise ValueError(
        "model.hidden: a cached call hides slots by cache.hidden, not by "
        "a window"
      )
    if shared is not None:
      return self._after_prefix(tokens, shared, at, cache, window), None
    cfg = self.cfg
    batch, t = tokens.shape
    start = jnp.zeros((batch,), jnp.int32) if cache is None else cache.length
    positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)
    x = self.embed[...].astype(cfg.dtype)[tokens]
    inv_freq = inverse_frequencies(cfg)

    # Plain JAX over the stacked layer state (unlike nnx.scan, it works at
    # any trace level, so the model runs inside decode loops and minibatch
    # scans). The uncached forward scans over layers, compiling one.
    block_def, stacked = nnx.split(self.layers)

    if cache is None:
      x = self._layers(block_def, stacked, x, positions, inv_freq, window, at)
      new_cache = None
    else:
      layers = [
        jax.tree.map(lambda a, i=i: a[i], stacked)
        for i in range(cfg.num_layers)
      ]
      x, new_cache = cached_layers(
        block_def, layers, x, positions, inv_freq, cache, num_new, at
      )
    return self.final_norm(x), new_cache

  def _layers(self, block_def, stacked, x, positions, inv_freq, window, at):
    """The uncached forward: a scan over the layers (the last apart when
    only the tokens ``at`` are wanted)."""

    def run(x, layer, at=None):
      block = nnx.merge(block_def, layer)
      return block(x, positions, inv_freq, None, window, at)[0]

    if self.cfg.remat != "none":
      run = jax.checkpoint(run, policy=REMAT_POLICIES[self.cfg.remat])
    scan = lambda x, layers: jax.lax.scan(
      lambda x, layer: (run(x, layer), None), x, layers
    )[0]
    if at is None:
      return scan(x, stacked)
    x = scan(x, jax.tree.map(lambda a: a[:-1], stacked))
    return run(x, jax.tree.map(lambda a: a[-1], stacked), at)

  def _after_prefix(self, tokens, shared, at, cache=None, window=None):
    """``hidden(tokens, at=at, shared=shared)``: each unit's prefix and
    each row's own tokens through a scan over the layers (the last apart:
    only the rows' tokens ``at``), ``[B, G, D]``."""
    if cache is not None or window is not None or at is None:
      raise ValueError(
        "model.hidden: a shared prefix takes no cache and no window, and "
        "needs the tokens `at` that are wanted"
      )
    cfg, inv_freq = self.cfg, inverse_frequencies(self.cfg)
    embed = lambda t: self.embed[...].astype(cfg.dtype)[t]
    xp, xs = (embed(t) for t in shared.split(tokens))
    block_def, stacked = nnx.split(self.layers)

    def run(x, layer, at=None):
      block = nnx.merge(block_def, layer)
      return block(x, None, inv_freq, None, at=at, shared=shared)[0]

    if cfg.remat != "none":
      run = jax.checkpoint(run, policy=REMAT_POLICIES[cfg.remat])
    x, _ = jax.lax.scan(
      lambda x, layer: (run(x, layer), None),
      (xp, xs),
      jax.tree.map(lambda a: a[:-1], stacked),
    )
    last = jax.tree.map(lambda a: a[-1], stacked)
    return self.final_norm(run(x, last, shared.within(at))[1])

  def logits(self, h: jax.Array) -> jax.Array:
    """``[B, T, D]`` -> float32 logits ``[B, T, vocab]``."""
    if self.cfg.tie_embeddings:
      w = self.embed[...].astype(h.dtype)
      out = jnp.einsum("BTD,VD->BTV", h, w)
    else:
      out = jnp.einsum("BTD,DV->BTV", h, self.lm_head[...].astype(h.dtype))
    return out.astype(jnp.float32)

  def token_logprobs(
    self,
    h: jax.Array,
    targets: jax.Array,
    temperature: float,
    allowed: jax.Array | None,
    chunk: int,
  ) -> tuple[jax.Array, jax.Array]:
    """Log-probabilities of ``targets [B, G]`` and the entropies, ``[B,
    G]`` each, of the policy at hidden states ``h [B, G, D]``
    (``head.logprobs``: temperature, allowed tokens, ``chunk`` tokens'
    logits at a time)."""
    tied = self.cfg.tie_embeddings
    w = (self.embed if tied else self.lm_head)[...]
    b, g, d = h.shape
    logp, entropy = head.logprobs(
      h.reshape(b * g, d),
      w,
      targets.reshape(-1),
      temperature,
      allowed,
      tied,
      chunk,
    )
    return logp.reshape(b, g), entropy.reshape(b, g)

  def values(self, h: jax.Array) -> jax.Array:
    """The critic's scalar value per token, float32 ``[B, T]``."""
    w = self.value_w[...].astype(jnp.float32)
    return jnp.einsum("BTD,D->BT", h.astype(jnp.float32), w) + self.value_b[...]

  def __call__(
    self,
    tokens: jax.Array,
    cache: KVCache | None = None,
    num_new: jax.Array | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    h, cache = self.hidden(tokens, cache, num_new)
    return self.logits(h), cache

  def for_decoding(self) -> Decoding:
    """The model as a decode loop should hold it (``Decoding``)."""
    return Decoding(self)


def cached_layers(
  block_def, layers, x, positions, inv_freq, cache, num_new, at=None
):
  """The layers ``layers`` (one state each) over ``x`` against ``cache``
  (the last one's output at the tokens ``at`` only, as ``hidden``'s).

  Cached calls (prefill, decode) unroll the layers, so that each layer's
  cache is its own buffer, updated in place."""
  k, v = [], []
  for i, layer in enumerate(layers):
    block = nnx.merge(block_def, layer)
    layer_cache = (cache.k[i], cache.v[i], cache.hidden, cache.shift)
    last = i == len(layers) - 1
    x, (k_i, v_i) = block(
      x, positions, inv_freq, layer_cache, at=at if last else None
    )
    k.append(k_i)
    v.append(v_i)
  if num_new is None:
    num_new = jnp.full(x.shape[:1], x.shape[1], jnp.int32)
  return x, cache.replace(k=tuple(k), v=tuple(v), length=cache.length + num_new)


class Decoding:
  """A model's cached calls with each layer's weights sliced out of the
  stack once, into buffers of their own, before the decode loops.

  Slicing a layer out of the ``[layers, ...]`` stack inside a loop copies
  it on every iteration on XLA:CPU: a 135M model's single-token step spent
  most of its time copying weights (``docs/benchmarks.md``). The slices
  cost one copy of the layers' weights while the rollout runs.
  """

  depends_on_row = False

  def __init__(self, model: Transformer):
    self.model = model
    self.block_def, stacked = nnx.split(model.layers)
    layers = [
      jax.tree.map(lambda a, i=i: a[i], stacked)
      for i in range(model.cfg.num_layers)
    ]
    # Materialised here, not re-sliced where the loops use them.
    self.layers = jax.lax.optimization_barrier(layers)

  def init_cache(self, batch: int, size: int) -> KVCache:
    return self.model.init_cache(batch, size)

  def hidden(self, tokens, cache, num_new=None, at=None):
    m = self.model
    positions = cache.length[:, None] + jnp.arange(
      tokens.shape[1], dtype=jnp.int32
    )
    x = m.embed[...].astype(m.cfg.dtype)[tokens]
    x, cache = cached_layers(
      self.block_def,
      self.layers,
      x,
      positions,
      inverse_frequencies(m.cfg),
      cache,
      num_new,
      at,
    )
    return m.final_norm(x), cache

  def logits(self, h: jax.Array) -> jax.Array:
    return self.model.logits(h)

  def __call__(self, tokens, cache, num_new=None):
    h, cache = self.hidden(tokens, cache, num_new)
    return self.logits(h), cache


def create(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model; sharding names stay metadata only."""
  with nnx.use_eager_sharding(False):
    return Transformer(cfg, nnx.Rngs(params=seed))
