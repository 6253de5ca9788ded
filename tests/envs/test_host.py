"""Python environments (``envs.host``) stepped from the compiled rollout:
gym-sokoban through the bridge against the jittable Sokoban, and faults
that end an episode, never the run."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs import HostSpec
from envs.jax.sokoban import solve
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo.experts import ScriptedPolicy
from starpo_jax.run import evaluator
from tests.envs.conftest import to_numpy
from tests.helpers import TRACES, counted
from tests.text_fixtures import TOKENIZERS

CFG = rollout.RolloutConfig(
  env_groups=25,
  group_size=8,
  max_turns=4,
  max_actions_per_turn=2,
  max_actions_per_traj=8,
  max_new_tokens=24,
  max_context=1024,
  temperature=0.0,
  enable_think=False,
)


def script_from(replies: list[list[str]], tok) -> jnp.ndarray:
  rows = [[t for r in turns for t in tok.encode(r)] for turns in replies]
  width = max(len(r) for r in rows) + 1
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return jnp.asarray(out)


@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
def test_gym_sokoban_through_the_bridge_plays_as_the_jittable_sokoban(tok_name):
  # 200 episodes (25 levels x 8) of scripted answers, the same on both
  # sides, gym-sokoban playing the jittable Sokoban's levels
  # (levels="sokoban"): every token the policy is shown, every reward,
  # every ending is equal.
  tok = TOKENIZERS[tok_name]()
  key = jax.random.key(5)
  jittable = envs.make("sokoban")
  states = jax.jit(lambda k: rollout.reset(jittable, CFG, k))(
    rollout.reset_key(key)
  )
  host = envs.batched(envs.make("gym_sokoban", levels="sokoban")).bind(
    tok.encode
  )
  rng = np.random.default_rng(0)
  names = jittable.spec.action_names
  replies = []
  for b in range(CFG.batch):
    # Every third episode plays a shortest solution (when it fits), the
    # others random actions.
    plan = solve(
      np.asarray(states.walls[b]),
      np.asarray(states.targets[b]),
      np.asarray(states.boxes[b]),
      int(states.player[b]),
      jittable.cols,
    )
    if b % 3 or len(plan) > CFG.max_actions_per_traj:
      plan = list(rng.integers(0, 4, CFG.max_actions_per_traj))
    turns = [plan[k : k + 2] for k in range(0, len(plan), 2)]
    replies.append(
      [
        "<answer>" + " || ".join(names[a] for a in t) + "</answer>"
        for t in turns
      ]
    )
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  out = {}
  for name, env in (("jax", jittable), ("host", host)):
    codec = codec_lib.Codec.build(tok, env.spec, CFG.prompt_settings())
    play = jax.jit(lambda p, c, k, env=env: rollout.rollout(p, c, env, CFG, k))
    out[name] = to_numpy(play(policy, codec, key))
  a, b = out["jax"], out["host"]
  # The same tokens: the compiled step tokenizes a jittable environment's
  # observation as its whole text (observation_tokens="text"), as the
  # host tokenizes gym-sokoban's.
  for field in (
    "tokens",
    "length",
    "turn_rewards",
    "turn_played",
    "turn_actions",
    "turn_effective",
    "num_actions",
    "success",
    "terminated",
  ):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field), field)
  # The script solves some levels and not others, and leaves some
  # episodes to run out of turns.
  assert 0 < b.success.sum() < CFG.batch
  assert b.turn_played[:, -1].any()
  assert not b.env_error.any() and not b.obs_truncated.any()


class Faulty:
  """Fails as told on its second step: raises, hangs, or returns the
  wrong type; on other steps a one-line world that ends on its fourth."""

  def __init__(self, fault: str, seen: list[int]):
    self.fault, self.seen, self.steps = fault, seen, 0

  def reset(self, seed):
    self.steps = 0
    return f"start {seed % 7}"

  def step(self, answer):
    self.steps += 1
    self.seen.append(self.steps)
    if self.steps == 2 and self.fault == "raise":
      raise RuntimeError("the world broke")
    if self.steps == 2 and self.fault == "hang":
      time.sleep(3.0)
    if self.steps == 2 and self.fault == "type":
      return "no reward", None, False, {}
    return f"at {self.steps}", 1.0, self.steps == 4, {"success": True}


@pytest.mark.parametrize(
  ("fault", "message"),
  [
    ("raise", "RuntimeError: the world broke"),
    ("hang", "no answer within 0.5 s"),
    ("type", "step's reward is NoneType, not a number"),
  ],
)
def test_a_failing_environment_ends_its_episode_only(fault, message):
  cfg = rollout.RolloutConfig(
    env_groups=2,
    group_size=2,
    max_turns=4,
    max_actions_per_turn=1,
    max_actions_per_traj=8,
    max_new_tokens=16,
    max_context=512,
    temperature=0.0,
    enable_think=False,
  )
  tok = TOKENIZERS["compact"]()
  seen: list[int] = []
  made = []

  def make():
    # The second object made (episode 1's at the first reset) fails.
    made.append(Faulty(fault if len(made) == 1 else "", seen))
    return made[-1]

  env = envs.batched(
    HostSpec(
      name="faulty",
      make=make,
      instructions="Say Go.",
      action_names=("Go",),
      max_obs_tokens=16,
      timeout_s=0.5,
    )
  ).bind(tok.encode)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  replies = [["<answer>Go</answer>"] * cfg.max_turns] * cfg.batch
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  TRACES.pop("host_rollout", None)
  play = jax.jit(
    counted("host_rollout", lambda p, c, k: rollout.rollout(p, c, env, cfg, k))
  )
  traj = to_numpy(play(policy, codec, jax.random.key(0)))
  assert traj.env_error.tolist() == [False, True, False, False]
  # The faulty episode's first step counted and its second ended it; the
  # others reached their world's end on the fourth.
  assert traj.num_actions.tolist() == [4, 1, 4, 4]
  assert traj.success.tolist() == [True, False, True, True]
  assert not traj.terminated[1] and traj.terminated[[0, 2, 3]].all()
  np.testing.assert_allclose(traj.episode_return, [4.0, 1.0, 4.0, 4.0])
  assert env.errors() == [None, f"step: {message}", None, None]
  # The transcript says what ended the episode.
  names = env.spec.action_names
  record = evaluator.episode_record(traj, tok, names, 1, env.errors()[1])
  assert record["error"] == f"step: {message}"
  assert (
    f"[environment error, the episode ended: step: {message}]"
    in evaluator.transcript(record)
  )
  assert "error" not in evaluator.episode_record(traj, tok, names, 0, None)
  # The next rollout starts clean: a fresh object in the failed slot, the
  # same compiled step.
  traj = to_numpy(play(policy, codec, jax.random.key(1)))
  assert not traj.env_error.any() and traj.num_actions.tolist() == [4] * 4
  assert env.errors() == [None] * 4
  assert len(made) == 5
  assert TRACES["host_rollout"] == 1


def test_a_reset_that_fails_leaves_its_episode_unplayed():
  class NoReset(Faulty):
    def reset(self, seed):
      return 7

  cfg = rollout.RolloutConfig(
    env_groups=1,
    group_size=2,
    max_turns=2,
    max_actions_per_turn=1,
    max_actions_per_traj=4,
    max_new_tokens=16,
    max_context=512,
    temperature=0.0,
    enable_think=False,
  )
  tok = TOKENIZERS["compact"]()
  made = []

  def make():
    made.append((NoReset if len(made) == 0 else Faulty)("", []))
    return made[-1]

  env = envs.batched(
    HostSpec(
      name="noreset",
      make=make,
      instructions="Say Go.",
      action_names=("Go",),
      max_obs_tokens=16,
    )
  ).bind(tok.encode)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  replies = [["<answer>Go</answer>"] * cfg.max_turns] * cfg.batch
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(
    jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))(
      policy, codec, jax.random.key(0)
    )
  )
  assert traj.env_error.tolist() == [True, False]
  assert traj.turn_played.tolist() == [[False, False], [True, True]]
  assert env.errors()[0] == "reset: reset returned int, not str"


def test_long_observations_are_cut_to_the_budget_and_counted():
  class Talkative(Faulty):
    def reset(self, seed):
      self.steps = 0
      return "word " * 50

    def step(self, answer):
      self.steps += 1
      text = "more " * 50 if self.steps == 1 else f"at {self.steps}"
      return text, 1.0, self.steps == 4, {}

  cfg = rollout.RolloutConfig(
    env_groups=1,
    group_size=2,
    max_turns=3,
    max_actions_per_turn=1,
    max_actions_per_traj=4,
    max_new_tokens=16,
    max_context=512,
    temperature=0.0,
    enable_think=False,
  )
  tok = TOKENIZERS["compact"]()
  env = envs.batched(
    HostSpec(
      name="talkative",
      make=lambda: Talkative("", []),
      instructions="Say Go.",
      action_names=("Go",),
      max_obs_tokens=8,
    )
  ).bind(tok.encode)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  replies = [["<answer>Go</answer>"] * cfg.max_turns] * cfg.batch
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(
    jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))(
      policy, codec, jax.random.key(0)
    )
  )
  # The first two observations were cut; the next ones ("at 2") fit.
  assert traj.obs_truncated.tolist() == [2, 2]
  shown = tok.decode(traj.tokens[0, : traj.length[0]])
  for text in ("word " * 50, "more " * 50):
    ids = tok.encode(text)
    assert tok.decode(ids[:8]) in shown and tok.decode(ids[:9]) not in shown


def test_an_unbound_host_environment_says_what_it_needs():
  env = envs.batched(envs.make("gym_sokoban"))
  with pytest.raises(RuntimeError, match="bind"):
    env.reset(jax.random.split(jax.random.key(0), 2))
  with pytest.raises(ValueError, match="levels='mine'; expected"):
    envs.make("gym_sokoban", levels="mine")


def test_gym_sokoban_trains_from_the_sokoban_config(tmp_path):
  from configs import sokoban
  from starpo_jax.run import assembly, train

  c = sokoban.get_config(None)
  c.env.name = "gym_sokoban"
  c.rollout.env_groups, c.rollout.group_size = 2, 2
  c.algo.minibatches = 1
  c.train.steps, c.train.eval_every = 1, 0
  # Its warm start would play the planner inside the compiled step.
  with pytest.raises(assembly.ConfigError, match=r"sft\.steps=0"):
    assembly.build(c)
  c.sft.steps = 0
  summary = train.run(c, str(tmp_path))
  assert summary["steps"] == 1
  final = summary["final"]
  assert final["rollout/env_error"] == 0.0
  assert final["rollout/num_turns"] > 0


@pytest.mark.parametrize("timeout_s", [0.0, -0.5])
def test_a_host_environments_timeout_must_be_positive(timeout_s):
  spec = lambda t: HostSpec(
    name="slow",
    make=lambda: None,
    instructions="Say Go.",
    action_names=("Go",),
    max_obs_tokens=16,
    timeout_s=t,
  )
  assert spec(1e-3).timeout_s == 1e-3
  with pytest.raises(ValueError, match=f"timeout_s={timeout_s} must be > 0"):
    spec(timeout_s)
