"""Gymnasium environments that speak text, through the host bridge
(``envs/host/gymnasium_text.py``), against gymnasium stepped directly."""

from __future__ import annotations

import dataclasses
import string

import gymnasium
import jax
import numpy as np
import pytest
from gymnasium import spaces

import envs
from envs.batch import reset_seeds
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo.experts import ScriptedPolicy
from tests.envs.conftest import to_numpy
from tests.envs.test_host import CFG, script_from
from tests.text_fixtures import TOKENIZERS

FROZEN = dict(
  id="FrozenLake-v1",
  actions="Left,Down,Right,Up",
  render_mode="ansi",
  is_slippery=True,
)
# The default 4x4 map's shortest path: Down, Down, Right, Down, Right, Right.
PATH = [1, 1, 2, 1, 2, 2]


def seeds_of(cfg, key) -> list[int]:
  """The seeds the rollout resets its host episodes with (the reference
  reproduces them)."""
  k_reset = jax.random.split(key)[0]
  return [int(s) for s in reset_seeds(rollout.level_keys(cfg, k_reset))]


@pytest.mark.parametrize(
  ("tok_name", "slippery"), [("compact", True), ("bpe", False)]
)
def test_frozen_lake_through_the_bridge_plays_as_gymnasium(tok_name, slippery):
  """FrozenLake (slippery: the seed drives every slide): action names
  through the compiled rollout, random or (not slippery) every third
  episode the shortest path; the same names played directly on
  ``gymnasium.make`` with the same seeds give the same boards in the
  prompts, rewards, endings and successes."""
  tok = TOKENIZERS[tok_name]()
  cfg = dataclasses.replace(CFG, env_groups=6, group_size=4)
  kwargs = {**FROZEN, "is_slippery": slippery}
  env = envs.batched(envs.make("gymnasium", **kwargs)).bind(tok.encode)
  names = env.spec.action_names
  rng = np.random.default_rng(1)
  plans = [
    PATH
    if b % 3 == 0 and not slippery
    else list(rng.integers(0, 4, cfg.max_actions_per_traj))
    for b in range(cfg.batch)
  ]
  replies = [
    [
      "<answer>" + " || ".join(names[a] for a in plan[k : k + 2]) + "</answer>"
      for k in range(0, len(plan), 2)
    ]
    for plan in plans
  ]
  key = jax.random.key(7)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  play = jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(play(policy, codec, key))
  for b, seed in enumerate(seeds_of(cfg, key)):
    ref = gymnasium.make(
      "FrozenLake-v1", render_mode="ansi", is_slippery=slippery
    )
    ref.reset(seed=seed)
    boards, rewards, success, used = [ref.render()], [], False, 0
    for turn in range(cfg.max_turns):
      reward, done = 0.0, False
      for a in plans[b][2 * turn : 2 * turn + 2]:
        _, r, terminated, truncated, _ = ref.step(int(a))
        reward += r
        used += 1
        done = terminated or truncated
        if done:
          success = terminated and r > 0
          break
      rewards.append(reward)
      boards.append(ref.render())
      if done:
        break
    turns = len(rewards)
    np.testing.assert_allclose(traj.turn_rewards[b, :turns], rewards)
    assert not traj.turn_played[b, turns:].any()
    assert traj.success[b] == success and traj.num_actions[b] == used
    seen = tok.decode(traj.tokens[b][: int(traj.length[b])])
    at = 0
    for board in boards[:turns]:  # each prompt shows the board, in order
      at = seen.index(board, at) + len(board)
  if not slippery:
    assert 0 < traj.success.sum() < cfg.batch
  assert not traj.env_error.any()


class Guess(gymnasium.Env):
  """Guess a number from 1 to 20 in free text; told higher or lower."""

  observation_space = spaces.Text(64, charset=string.printable)
  action_space = spaces.Text(16, charset=string.printable)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.secret = int(self.np_random.integers(1, 21))
    return "Guess a number from 1 to 20.", {}

  def step(self, action):
    guess = int(action) if action.strip().isdigit() else -1
    if guess == self.secret:
      return "Right!", 1.0, True, False, {}
    hint = "Higher." if guess < self.secret else "Lower."
    return hint, 0.0, False, False, {}


gymnasium.register("GuessTest-v0", entry_point=Guess, max_episode_steps=6)


def test_free_text_answers_and_a_tool_in_a_gymnasium_environment():
  """A Text action space takes the answer's text; a blank answer steps
  nothing; the calculator answers between turns."""
  tok = TOKENIZERS["bpe"]()
  cfg = dataclasses.replace(
    CFG, env_groups=2, group_size=2, max_turns=4, max_actions_per_turn=1
  )
  env = envs.batched(
    envs.make(
      "gymnasium", id="GuessTest-v0", tools="calculator", max_obs_tokens=32
    )
  ).bind(tok.encode)
  assert env.spec.text_answers and env.spec.max_steps == 6
  key = jax.random.key(3)
  secrets = []
  for seed in seeds_of(cfg, key):
    ref = gymnasium.make("GuessTest-v0")
    ref.reset(seed=seed)
    secrets.append(ref.unwrapped.secret)
  replies = [
    [f"<answer>{secrets[0]}</answer>"],
    ["<answer> </answer>", "<tool>calculator: 7 + 3</tool>",
     f"<answer>{secrets[1]}</answer>"],
    ["<answer>0</answer>", "<answer>21</answer>", "<answer>x</answer>",
     "<answer>0</answer>"],
    ["<tool>calculator: 2 * 10</tool>", "<answer>20</answer>"],
  ]  # fmt: skip
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  play = jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(play(policy, codec, key))
  seen = [tok.decode(traj.tokens[b][: int(traj.length[b])]) for b in range(4)]
  assert traj.success[0] and traj.num_actions[0] == 1
  assert traj.success[1] and traj.num_actions[1] == 1  # the blank steps nothing
  assert list(traj.turn_penalized[1, :3]) == [True, False, False]
  assert list(traj.turn_tool[1, :3]) == [False, True, False]
  assert "<result>10</result>" in seen[1]
  assert not traj.success[2] and traj.num_actions[2] == 4
  assert seen[2].count("Higher.") == 2 and seen[2].count("Lower.") == 1
  assert "<result>20</result>" in seen[3]
  assert traj.success[3] == (secrets[3] == 20)


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({}, "set id"),
    ({"id": "NoSuchEnv-v0"}, "NoSuchEnv"),
    ({"id": "FrozenLake-v1", "actions": "Left,Right"}, "Discrete"),
    ({"id": "FrozenLake-v1"}, "not Text: name its actions"),
    ({**FROZEN, "tools": "abacus"}, "unknown tool 'abacus'"),
  ],
)
def test_bad_gymnasium_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    envs.make("gymnasium", **kwargs)


def test_an_observation_that_is_not_text_ends_the_episode_with_a_message():
  tok = TOKENIZERS["bpe"]()
  env = envs.batched(
    envs.make("gymnasium", id="FrozenLake-v1", actions="Left,Down,Right,Up")
  ).bind(tok.encode)
  states = jax.jit(lambda k: rollout.reset(env, CFG, k))(jax.random.key(0))
  assert np.asarray(states.error).all()
  assert "render_mode='ansi'" in env.errors()[0]
