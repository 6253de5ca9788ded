"""Token sampling (greedy, temperature, top-k, top-p) and a cached decode
loop for single-turn generation.

The log-probability recorded for a sampled token is under the
temperature-scaled policy, ``log_softmax(logits / temperature)``, before any
top-k / top-p truncation: that is the quantity PPO's ratio is taken
against, and the training forward recomputes it the same way.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from starpo_jax.models.transformer import KVCache, Transformer

# The logit given to tokens a restricted policy may not emit.
DISALLOWED = -1e9


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How to pick the next token. ``temperature == 0`` is greedy."""

  temperature: float = 1.0
  top_k: int = 0  # 0 keeps every token
  top_p: float = 1.0

  def __post_init__(self) -> None:
    if self.temperature < 0:
      raise ValueError(f"sampling: temperature={self.temperature} must be >= 0")
    if self.top_k < 0:
      raise ValueError(f"sampling: top_k={self.top_k} must be >= 0")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"sampling: top_p={self.top_p} must be in (0, 1]")


def policy_logprobs(
  logits: jax.Array, temperature: float, allowed: jax.Array | None = None
) -> jax.Array:
  """Log-probabilities ``[..., V]`` of the temperature-scaled policy.

  ``allowed`` (``[V]`` bool) restricts the policy to some tokens.
  """
  scale = temperature if temperature > 0 else 1.0
  z = logits.astype(jnp.float32) / scale
  if allowed is not None:
    # Finite, so that 0 * logp stays 0 in gradients; exp() underflows to 0.
    z = jnp.where(allowed, z, DISALLOWED)
  return jax.nn.log_softmax(z, axis=-1)


def sample(
  key: jax.Array,
  logits: jax.Array,
  sampling: Sampling,
  allowed: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Picks one token per row.

  Args:
    key: PRNG key, or one per row ``[B]`` (a row's token then depends on
      its own key alone, wherever the row sits in the batch).
    logits: float ``[B, V]``.
    sampling: the rule.
    allowed: optional ``[V]`` bool, the tokens the policy may emit.

  Returns:
    tokens int32 ``[B]`` and their policy log-probabilities float32 ``[B]``.
  """
  logp = policy_logprobs(logits, sampling.temperature, allowed)
  if sampling.temperature == 0:
    tokens = first_max(logp)
  else:
    masked = logp
    if sampling.top_k:
      kth = jax.lax.top_k(logp, sampling.top_k)[0][..., -1:]
      masked = jnp.where(logp < kth, -jnp.inf, masked)
    if sampling.top_p < 1.0:
      order = jnp.argsort(-masked, axis=-1)
      sorted_logp = jnp.take_along_axis(masked, order, axis=-1)
      probs = jax.nn.softmax(sorted_logp, axis=-1)
      # Keep the smallest prefix whose mass reaches top_p (the first token
      # is always kept).
      before = jnp.cumsum(probs, axis=-1) - probs
      drop_sorted = before >= sampling.top_p
      drop = (
        jnp.zeros_like(drop_sorted)
        .at[jnp.arange(order.shape[0])[:, None], order]
        .set(drop_sorted)
      )
      masked = jnp.where(drop, -jnp.inf, masked)
    if key.ndim:
      tokens = jax.vmap(categorical)(key, masked)
    else:
      tokens = categorical(key, masked)
  tokens = tokens.astype(jnp.int32)
  return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


def first_max(x: jax.Array) -> jax.Array:
  """``jnp.argmax(x, axis=-1)`` (the first of equal maxima) as two plain
  reductions: XLA:CPU runs a fused argmax over a 49,152-token vocabulary
  as a scalar loop, where two reductions vectorise."""
  top = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
  """``jax.random.categorical(key, logits, axis=-1)``, the same draw (the
  Gumbel-max trick with the same noise), its argmax by ``first_max``."""
  noise = jax.random.gumbel(key, logits.shape, logits.dtype)
  return first_max(noise + logits)


@struct.dataclass
class DecodeState:
  step: jax.Array  # [] int32
  last: jax.Array  # [B] int32, the token to feed next
  tokens: jax.Array  # [B, N] int32, generated tokens
  logprobs: jax.Array  # [B, N] float32
  done: jax.Array  # [B] bool
  length: jax.Array  # [B] int32, generated tokens per sequence
  cache: KVCache
  key: jax.Array


def _prefill(
  model: Transformer,
  prompt: jax.Array,
  prompt_lengths: jax.Array,
  cache: KVCache,
  key: jax.Array,
  sampling: Sampling,
  stops: jax.Array,
  max_new_tokens: int,
) -> DecodeState:
  """The prompts through the model and each one's first sampled token."""
  batch = prompt.shape[0]
  logits, cache = model(prompt, cache, num_new=prompt_lengths)
  last_logits = jnp.take_along_axis(
    logits, (prompt_lengths - 1)[:, None, None], axis=1
  )[:, 0]
  key, sub = jax.random.split(key)
  first, first_logp = sample(sub, last_logits, sampling)
  zeros = jnp.zeros((batch, max_new_tokens), jnp.int32)
  return DecodeState(
    step=jnp.zeros((), jnp.int32),
    last=first,
    tokens=zeros.at[:, 0].set(first),
    logprobs=zeros.astype(jnp.float32).at[:, 0].set(first_logp),
    done=jnp.isin(first, stops),
    length=jnp.ones((batch,), jnp.int32),
    cache=cache,
    key=key,
  )


def generate(
  model: Transformer,
  prompt: jax.Array,
  prompt_lengths: jax.Array,
  *,
  max_new_tokens: int,
  key: jax.Array,
  sampling: Sampling,
  stop_ids: tuple[int, ...] = (),
  cache_size: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Continues each prompt by up to ``max_new_tokens`` tokens.

  Args:
    model: the policy.
    prompt: int32 ``[B, P]``, left-aligned, padded after the prompt.
    prompt_lengths: int32 ``[B]``.
    max_new_tokens: the most tokens generated per sequence.
    key: PRNG key.
    sampling: the rule.
    stop_ids: a sequence ends after emitting one of these (kept).
    cache_size: KV cache slots; at least ``P + max_new_tokens``.

  Returns:
    tokens int32 ``[B, max_new_tokens]`` (zero after a sequence ends), their
    log-probabilities, and how many each sequence generated.
  """
  batch, width = prompt.shape
  size = cache_size or width + max_new_tokens
  if size < width + max_new_tokens:
    raise ValueError(
      f"generate: cache_size={size} < prompt width {width} + "
      f"max_new_tokens={max_new_tokens}"
    )
  stops = jnp.asarray(stop_ids, jnp.int32)
  cache = KVCache.init(model.cfg, batch, size)
  state = _prefill(
    model, prompt, prompt_lengths, cache, key, sampling, stops, max_new_tokens
  )

  def cond(s: DecodeState) -> jax.Array:
    return (s.step + 1 < max_new_tokens) & ~jnp.all(s.done)

  body = lambda s: _decode_step(model, s, sampling, stops)
  state = jax.lax.while_loop(cond, body, state)
  return state.tokens, state.logprobs, state.length


def _decode_step(
  model: Transformer, s: DecodeState, sampling: Sampling, stops: jax.Array
) -> DecodeState:
  """One token more for every sequence still going."""
  logits, cache = model(s.last[:, None], s.cache)
  key, sub = jax.random.split(s.key)
  tok, logp = sample(sub, logits[:, 0], sampling)
  i = s.step + 1
  live = ~s.done
  tok = jnp.where(live, tok, 0)
  return DecodeState(
    step=i,
    last=tok,
    tokens=s.tokens.at[:, i].set(tok),
    logprobs=s.logprobs.at[:, i].set(jnp.where(live, logp, 0.0)),
    done=s.done | jnp.isin(tok, stops),
    length=s.length + live,
    cache=cache,
    key=key,
  )
