"""Jittable environments (``envs.core.Env``) as a ``BatchEnv``: one
episode's pure functions under ``vmap``, a turn's actions a ``scan``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from envs.batch.protocol import Turn
from envs.core import Env, EnvSpec
from envs.jax import planning


@dataclasses.dataclass(frozen=True)
class VmapEnv:
  """A batch of a jittable environment's episodes; static (hashable), so
  it can be a static argument of ``jit``."""

  env: Env

  @property
  def spec(self) -> EnvSpec:
    return self.env.spec

  @property
  def jittable(self) -> Env:
    return self.env

  def bind(self, encode: Any, batch_axes: tuple[str, ...] = ()) -> VmapEnv:
    """Observations are pieces, rendered to tokens in the graph: nothing
    to bind."""
    del encode, batch_axes
    return self

  def reset(self, keys: jax.Array) -> Any:
    return jax.vmap(self.env.reset)(keys)[0]

  def render(self, states: Any) -> tuple[jax.Array, jax.Array]:
    return jax.vmap(self.env.render)(states)

  def act(
    self,
    states: Any,
    actions: jax.Array,
    answer: Any,
    active: jax.Array,
    used: jax.Array,
    budget: int,
  ) -> Turn:
    """Plays each active episode's actions ``[B, A]`` in order (-1: none)
    while it lives, within ``budget`` actions an episode; an environment
    with text answers takes ``answer`` (batched ``envs.Answer``) in one
    step."""
    text = self.spec.text_answers

    def one(t: Turn, action: jax.Array) -> tuple[Turn, jax.Array]:
      go = active & (action >= 0) & ~t.done & (t.used < budget)
      taken = answer if text else jnp.maximum(action, 0)
      new, ts = jax.vmap(self.env.step)(t.states, taken)
      where = lambda x, o: jnp.where(go.reshape(-1, *[1] * (x.ndim - 1)), x, o)
      return Turn(
        states=jax.tree.map(where, new, t.states),
        used=t.used + go,
        done=t.done | (go & ts.done),
        reward=t.reward + jnp.where(go, ts.reward, 0.0),
        effective=t.effective | (go & ts.effective),
        stepped=t.stepped | go,
        success=jnp.where(go, ts.success, t.success),
        terminated=jnp.where(go, ts.terminated, t.terminated),
        unavailable=t.unavailable + (go & ~ts.valid),
        executed=t.executed,
      ), jnp.where(go, action, -1)

    b = actions.shape[0]
    false = jnp.zeros((b,), bool)
    start = Turn(
      states=states,
      used=used,
      done=false,
      reward=jnp.zeros((b,), jnp.float32),
      effective=false,
      stepped=false,
      success=false,
      terminated=false,
      unavailable=jnp.zeros((b,), jnp.int32),
      executed=jnp.zeros((0,), jnp.int32),
    )
    turn, executed = jax.lax.scan(one, start, actions.T)
    return turn.replace(executed=executed)

  def failed(self, states: Any) -> jax.Array:
    """A jittable environment cannot fail an episode."""
    return jnp.zeros(states.key.shape[:1], bool)

  def cut(self, states: Any) -> jax.Array:
    """Its observations fit their budget by construction."""
    return jnp.zeros(states.key.shape[:1], jnp.int32)

  def random_success(
    self, states: Any, horizon: int, key: jax.Array
  ) -> jax.Array:
    """Which episodes ``[B]`` a player solves that takes up to ``horizon``
    uniformly random actions among those valid in each state; with text
    answers, one ``random_answer`` (Countdown: the numbers in a random
    order joined by random operators)."""
    env = self.env
    b = jax.tree.leaves(states)[0].shape[0]
    keys = jax.random.split(key, b)
    if env.spec.text_answers:
      answers = jax.vmap(env.random_answer)(states, keys)
      return jax.vmap(env.step)(states, answers)[1].success
    play = lambda s, k: planning.random_valid_play(env, s, horizon, k)[1]
    return jax.vmap(play)(states, keys)

  def errors(self) -> list[str | None]:
    return []
