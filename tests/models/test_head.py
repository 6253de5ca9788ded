"""The loss head (``models.head``) against the plain computation: logits
formed whole, ``log_softmax`` of the temperature-scaled restricted policy,
the targets' log-probabilities and the entropies, JAX's own gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from starpo_jax.models import head
from tests.helpers import assert_close_at_scale

N, D, V = 13, 16, 37


def plain(h, w, targets, temperature, allowed, tied):
  logits = h @ (w.T if tied else w)
  z = logits / (temperature if temperature > 0 else 1.0)
  if allowed is not None:
    z = jnp.where(allowed, z, head.DISALLOWED)
  logp = jax.nn.log_softmax(z, axis=-1)
  chosen = jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
  return chosen, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@pytest.mark.parametrize(
  "tied, temperature, restricted, chunk, budget",
  [
    (True, 0.7, False, 5, head.SAVED_LOGITS_BYTES),  # 3 chunks, padded
    (True, 0.0, True, 13, 0),  # one chunk, logits formed again
    (False, 1.3, True, 4, 0),  # untied, padded, formed again
    (False, 1.0, False, 64, head.SAVED_LOGITS_BYTES),
  ],
)
def test_head_equals_the_plain_log_softmax_in_values_and_gradients(
  tied, temperature, restricted, chunk, budget
):
  keys = jax.random.split(jax.random.key(0), 5)
  h = jax.random.normal(keys[0], (N, D))
  w = jax.random.normal(keys[1], (V, D) if tied else (D, V))
  allowed = None
  if restricted:
    allowed = jax.random.bernoulli(keys[2], 0.6, (V,)).at[:3].set(True)
  targets = jax.random.randint(keys[3], (N,), 0, 3 if restricted else V)
  coef = jax.random.normal(keys[4], (2, N))

  def run(fn):
    def loss(h, w):
      logp, ent = fn(h, w)
      return jnp.sum(coef[0] * logp + coef[1] * ent)

    out = fn(h, w)
    return out, jax.grad(loss, argnums=(0, 1))(h, w)

  got = run(
    lambda h, w: head.logprobs(
      h, w, targets, temperature, allowed, tied, chunk, budget
    )
  )
  want = run(lambda h, w: plain(h, w, targets, temperature, allowed, tied))
  names = ("logp", "entropy", "dh", "dw")
  flat = (*got[0], *got[1]), (*want[0], *want[1])
  for name, a, b in zip(names, *flat, strict=True):
    assert_close_at_scale(a, b, rtol=1e-5, err_msg=name)


def test_the_head_keeps_the_logits_only_within_its_budget():
  h, w = jnp.ones((8, D)), jnp.ones((V, D))
  t = jnp.zeros(8, jnp.int32)

  def saved(budget):
    fwd = jax.jit(
      lambda h, w: jax.vjp(
        lambda h, w: head.logprobs(h, w, t, 1.0, None, True, 4, budget), h, w
      )[1]
    )
    shapes = {x.shape for x in jax.tree.leaves(jax.eval_shape(fwd, h, w))}
    return (2, 4, V) in shapes

  # Two chunks of 4 tokens' float32 logits: 8 * V * 4 bytes.
  assert saved(8 * V * 4)
  assert not saved(8 * V * 4 - 1)
