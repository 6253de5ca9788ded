"""The output layer as a loss head: the chosen tokens' log-probabilities
and the distributions' entropies from final hidden states, in one pass
over the vocabulary with a gradient written by hand.

``logprobs(h, w, ...)`` forms the logits ``chunk`` tokens at a time
(never ``[tokens, vocab]`` of a whole batch unless it fits ``budget``),
takes the log-softmax of the temperature-scaled, restricted policy
(``sampling.policy_logprobs``' distribution), and returns the chosen
token's log-probability and the entropy. Its backward pass turns both
cotangents into one ``dlogits`` per chunk,

    dz = g_logp * (onehot - p) - g_ent * p * (log p + H),

and spends one product each on the hidden states' and the weight's
gradient. Where every chunk's logits fit ``budget`` bytes the forward
keeps them for the backward; otherwise the backward forms them again
(one more product per chunk instead of the memory). The weight's
gradient is accumulated as ``[V, D]`` (``dz`` the product's transposed
operand, so that XLA:CPU does not copy the vocabulary-wide operand
into a transposed layout); an untied ``[D, V]`` weight gets it transposed
once at the end, not per chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# The logit given to tokens a restricted policy may not emit: finite, so
# that 0 * logp stays 0 in gradients; exp() underflows to 0.
DISALLOWED = -1e9

# The forward keeps every chunk's log-probabilities for the backward when
# they take at most this many bytes (float32); otherwise the backward
# forms the logits again.
SAVED_LOGITS_BYTES = 1 << 30


def scaled(
  logits: jax.Array, temperature: float, allowed: jax.Array | None
) -> jax.Array:
  """Float32 logits divided by ``temperature`` (0: 1), with the tokens
  ``allowed [V]`` does not hold at ``DISALLOWED``."""
  z = logits.astype(jnp.float32) / (temperature if temperature > 0 else 1.0)
  return z if allowed is None else jnp.where(allowed, z, DISALLOWED)


def logprobs(
  h: jax.Array,
  w: jax.Array,
  targets: jax.Array,
  temperature: float,
  allowed: jax.Array | None,
  tied: bool,
  chunk: int,
  budget: int = SAVED_LOGITS_BYTES,
) -> tuple[jax.Array, jax.Array]:
  """Log-probabilities of ``targets [N]`` and entropies, ``[N]`` each, of
  the policy whose logits are ``h [N, D]`` times the output weight ``w``
  (``[V, D]``, a tied embedding; else ``[D, V]``), divided by
  ``temperature`` (0: 1) over the tokens ``allowed [V]`` (None: all), the
  logits formed ``chunk`` tokens at a time."""
  n = h.shape[0]
  vocab = w.shape[0] if tied else w.shape[1]
  chunk = max(1, min(chunk, n))
  save = 4 * (n + -n % chunk) * vocab <= budget
  return _head(h, w, targets, allowed, temperature, tied, chunk, save)


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
  """``x [N, ...]`` padded to whole chunks, ``[N / chunk, chunk, ...]``."""
  pad = -x.shape[0] % chunk
  x = jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1))
  return x.reshape(-1, chunk, *x.shape[1:])


def _logits(h: jax.Array, w: jax.Array, tied: bool) -> jax.Array:
  w = w.astype(h.dtype)
  if tied:
    return jnp.einsum("ND,VD->NV", h, w)
  return jnp.einsum("ND,DV->NV", h, w)


def _chunk_forward(h, w, t, allowed, temperature, tied):
  """One chunk: the scaled logits ``z [c, V]``, their log-normalisers,
  the targets' log-probabilities and the entropies, ``[c]`` each. The
  exponentials feed both sums without a ``[c, V]`` log-softmax."""
  z = scaled(_logits(h, w, tied), temperature, allowed)
  m = jnp.max(z, axis=-1)
  e = jnp.exp(z - m[:, None])
  total = jnp.sum(e, axis=-1)
  lse = m + jnp.log(total)
  chosen = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0] - lse
  entropy = lse - jnp.sum(e * z, axis=-1) / total
  return z, lse, chosen, entropy


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _head(h, w, targets, allowed, temperature, tied, chunk, save):
  return _head_fwd(h, w, targets, allowed, temperature, tied, chunk, save)[0]


def _head_fwd(h, w, targets, allowed, temperature, tied, chunk, save):
  n = h.shape[0]
  z, lse, chosen, entropy = jax.lax.map(
    lambda x: _chunk_forward(x[0], w, x[1], allowed, temperature, tied),
    (_chunks(h, chunk), _chunks(targets, chunk)),
  )
  out = (chosen.reshape(-1)[:n], entropy.reshape(-1)[:n])
  return out, (h, w, targets, allowed, z if save else None, lse, entropy)


def _head_bwd(temperature, tied, chunk, save, res, g):
  h, w, targets, allowed, kept, lse, entropy = res
  n, d = h.shape
  vocab = w.shape[0] if tied else w.shape[1]
  scale = temperature if temperature > 0 else 1.0

  def one(dw, x):
    hc, tc, gl, ge, lc, ent, z = x
    if z is None:
      z = _chunk_forward(hc, w, tc, allowed, temperature, tied)[0]
    logp = z - lc[:, None]
    dz = -jnp.exp(logp) * (gl[:, None] + ge[:, None] * (logp + ent[:, None]))
    dz = dz.at[jnp.arange(tc.shape[0]), tc].add(gl)
    if allowed is not None:
      dz = jnp.where(allowed, dz, 0.0)
    dz = (dz / scale).astype(hc.dtype)
    wc = w.astype(hc.dtype)
    dh = jnp.einsum("NV,VD->ND" if tied else "NV,DV->ND", dz, wc)
    return dw + jnp.einsum("NV,ND->VD", dz, hc).astype(jnp.float32), dh

  g_logp, g_ent = g
  chunked = (_chunks(x, chunk) for x in (h, targets, g_logp, g_ent))
  xs = (*chunked, lse, entropy, kept)
  dw, dh = jax.lax.scan(one, jnp.zeros((vocab, d), jnp.float32), xs)
  dw = dw if tied else dw.T
  dh = dh.reshape(-1, d)[:n].astype(h.dtype)
  return dh, dw.astype(w.dtype), None, None


_head.defvjp(_head_fwd, _head_bwd)
