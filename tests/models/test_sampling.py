"""Token sampling's argmax and categorical draw against JAX's own: the
same token for every key, ties to the first maximum, masked tokens never
drawn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.models import sampling


def test_first_max_is_argmax_ties_and_minus_infinity_included():
  x = jnp.asarray(
    [
      [0.0, 3.0, 3.0, -1.0],  # a tie: the first
      [-jnp.inf, -jnp.inf, 2.0, 2.0],
      [5.0, -jnp.inf, 5.0, 5.0],
      [-2.0, -3.0, -4.0, -1.0],  # the last
    ]
  )
  np.testing.assert_array_equal(sampling.first_max(x), [1, 2, 0, 3])
  rng = np.random.default_rng(0)
  many = jnp.asarray(rng.integers(0, 4, (200, 9)), jnp.float32)
  np.testing.assert_array_equal(
    sampling.first_max(many), jnp.argmax(many, axis=-1)
  )


def test_categorical_draws_what_jax_random_categorical_draws():
  logits = jax.random.normal(jax.random.key(1), (6, 50)) * 3
  logits = logits.at[:, :10].set(-jnp.inf)  # masked (top-k, top-p)
  keys = jax.random.split(jax.random.key(2), 300)
  got = jax.vmap(
    lambda k: jax.vmap(sampling.categorical)(jax.random.split(k, 6), logits)
  )(keys)
  want = jax.vmap(
    lambda k: jax.vmap(jax.random.categorical)(jax.random.split(k, 6), logits)
  )(keys)
  np.testing.assert_array_equal(got, want)
  assert int(jnp.min(got)) >= 10
