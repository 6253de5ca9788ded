"""Shared, compile-once helpers for the environment tests."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import envs
from tests.helpers import counted

NUM_LEVELS = 1024


@functools.cache
def batch_reset(name: str, **kwargs):
  """``jit(vmap(env.reset))`` for a registered env, compiled once per name.

  Its traces are counted in ``tests.helpers.TRACES[reset_trace_name(...)]``.
  """
  env = envs.make(name, **kwargs)
  fn = counted(reset_trace_name(name, **kwargs), env.reset)
  return env, jax.jit(jax.vmap(fn))


def reset_trace_name(name: str, **kwargs) -> str:
  return f"reset:{name}:{sorted(kwargs.items())}"


@functools.cache
def level_pool(name: str, seed: int = 0):
  """``NUM_LEVELS`` reset states of ``envs.make(name)`` as a jax pytree."""
  _, reset = batch_reset(name)
  keys = jax.random.split(jax.random.key(seed), NUM_LEVELS)
  states, _ = reset(keys)
  return states


def play(env, states, actions):
  """Steps a batch of states through action sequences, rendering each state.

  Args:
    env: the environment.
    states: a batch of states ``[B, ...]``.
    actions: int32 ``[B, T]``.

  Returns:
    A dict of numpy arrays: ``pieces0 [B, P]``, ``n0 [B]`` (the first
    observation), and per step ``pieces [B, T, P]``, ``n [B, T]``, the
    ``TimeStep`` fields ``[B, T]`` and the states after each step.
  """
  return to_numpy(_player(env)(states, jnp.asarray(actions)))


def to_numpy(tree):
  """A pytree as numpy arrays; PRNG keys become their raw key data."""

  def leaf(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.asarray(x)

  return jax.tree.map(leaf, tree)


@functools.cache
def _player(env):
  def one(state, actions):
    pieces0, n0 = env.render(state)

    def body(state, action):
      state, ts = env.step(state, action)
      pieces, n = env.render(state)
      out = dict(
        pieces=pieces,
        n=n,
        reward=ts.reward,
        terminated=ts.terminated,
        truncated=ts.truncated,
        success=ts.success,
        valid=ts.valid,
        effective=ts.effective,
        state=state,
      )
      return state, out

    _, out = jax.lax.scan(body, state, actions)
    return dict(pieces0=pieces0, n0=n0, **out)

  return jax.jit(jax.vmap(one))


def text(spec, pieces, n) -> str:
  return envs.to_text(spec, pieces, n)


def index(tree, i):
  return jax.tree.map(lambda x: x[i], tree)
