"""Every environment's jitted, vmapped reset and step compile once."""

from __future__ import annotations

import chex
import jax
import pytest

from tests.envs.conftest import NUM_LEVELS, batch_reset, reset_trace_name
from tests.helpers import TRACES, assert_compiles_once


@pytest.mark.parametrize(
  "name", ["sokoban", "frozen_lake", "bandit", "sudoku_4x4"]
)
def test_reset_and_step_compile_once_for_1024_envs(name):
  env, reset = batch_reset(name)
  states, _ = reset(jax.random.split(jax.random.key(1), NUM_LEVELS))
  reset(jax.random.split(jax.random.key(2), NUM_LEVELS))
  assert TRACES[reset_trace_name(name)] == 1
  keys = jax.random.split(jax.random.key(3), 2)
  actions = [
    jax.random.randint(k, (NUM_LEVELS,), 0, env.spec.num_actions) for k in keys
  ]
  (_, ts), _ = assert_compiles_once(
    jax.vmap(env.step), (states, actions[0]), (states, actions[1])
  )
  chex.assert_tree_all_finite(ts.reward)
