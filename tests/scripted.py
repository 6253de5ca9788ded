"""A policy that emits a fixed token script, for testing the rollout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ScriptCache:
  length: jax.Array  # [B] tokens held
  pos: jax.Array  # [B] script tokens emitted

  def broadcast(self, batch: int) -> ScriptCache:
    return ScriptCache(
      jnp.broadcast_to(self.length, (batch,)),
      jnp.broadcast_to(self.pos, (batch,)),
    )


@struct.dataclass
class ScriptedPolicy:
  """Row b emits ``script[b, 0], script[b, 1], ...`` whatever it is shown.

  Its logits put all mass on the next script token, so greedy decoding and
  sampling alike reproduce the script.
  """

  script: jax.Array  # [B, S] int32
  vocab: int = struct.field(pytree_node=False)

  def init_cache(self, batch: int, size: int) -> ScriptCache:
    del size
    zeros = jnp.zeros((batch,), jnp.int32)
    return ScriptCache(zeros, zeros)

  def _next(self, pos: jax.Array) -> jax.Array:
    rows = jnp.arange(pos.shape[0]) % self.script.shape[0]
    return self.script[rows, jnp.clip(pos, 0, self.script.shape[1] - 1)]

  def hidden(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    nxt = self._next(cache.pos).astype(jnp.float32)
    h = jnp.broadcast_to(nxt[:, None, None], (*tokens.shape, 1))
    return h, ScriptCache(cache.length + num_new, cache.pos)

  def logits(self, h):
    return 50.0 * jax.nn.one_hot(h[..., 0].astype(jnp.int32), self.vocab)

  def __call__(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    pos = cache.pos + num_new
    logits = 50.0 * jax.nn.one_hot(self._next(pos), self.vocab)
    return logits[:, None], ScriptCache(cache.length + num_new, pos)
