"""The supervised warm start: expert episodes in the rollout's format, and
the imitation step."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from configs import bandit, countdown, frozen_lake, qa, sokoban, sudoku_4x4
from envs.jax.qa import dataset
from envs.jax.sokoban import solve
from reference import countdown as ref_countdown
from reference import envs as ref
from reference import text as ref_text
from starpo_jax.agent import rollout
from starpo_jax.algo import experts, logprobs, sft
from starpo_jax.algo.spec import Distribution
from starpo_jax.run import assembly
from starpo_jax.run.assembly.setup import warm_start_replies
from tests.envs import test_thoughts
from tests.envs.conftest import index, to_numpy
from tests.helpers import (
  assert_close_at_scale,
  peer_of,
  traced_at_most_once,
)

EPISODES = 24


def small(config, **overrides):
  config.sft.steps = 2
  config.sft.episodes = EPISODES
  config.train.eval_every = 0
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def expert_episodes(setup, key, expert: str = "planner"):
  """The settings the warm start's episodes for ``setup`` ran with, the
  episodes and whether the expert had actions for each level."""
  cfg = sft.episodes_config(setup.config.rollout, setup.config.sft, setup.codec)
  replies = experts.Replies.build(setup.tokenizer, setup.env.spec)
  traj, found = jax.jit(
    lambda codec, key: experts.expert_trajectories(
      setup.env,
      codec,
      replies,
      cfg,
      key,
      expert=experts.ExpertPlay(expert, setup.config.sft.search_tries),
    )
  )(setup.codec, key)
  return cfg, traj, found


@functools.cache
def expert_run(name: str):
  """Whole expert episodes (every turn) of one environment."""
  module = {"sokoban": sokoban, "frozen_lake": frozen_lake}[name]
  setup = assembly.build(small(module.get_config(None), **{"sft.max_turns": 5}))
  key = jax.random.key(7)
  cfg, traj, _ = expert_episodes(setup, key)
  states = rollout.reset(setup.env, cfg, rollout.reset_key(key))
  return setup, cfg, to_numpy(traj), to_numpy(states)


def replies_of(traj, tok, b):
  tokens, mask, turns = traj.tokens[b], traj.loss_mask[b], traj.turn_ids[b]
  return [
    tok.decode(tokens[mask & (turns == k)]) for k in range(turns.max() + 1)
  ]


def read_reply(reply, cfg, names):
  """A reply read back with RAGEN's grammar, independently of the jitted
  parser: (matched, action ids)."""
  return ref_text.parse(
    ("<answer>" + reply).encode(),
    think=False,
    markers=(),
    max_actions=cfg.max_actions_per_turn,
    action_names=names,
  )


def shortest(name, env, s, peer):
  if name == "sokoban":
    return len(solve(s.walls, s.targets, s.boxes, int(s.player), env.cols))
  # FrozenLake: breadth-first over cells, never through a hole.
  frontier, seen, depth = {peer.start}, {peer.start}, 0
  while peer.goal not in frontier:
    nxt = set()
    for r, c in frontier:
      for dr, dc in ref.FROZEN_LAKE_MOVES.values():
        top = env.size - 1
        cell = (min(max(r + dr, 0), top), min(max(c + dc, 0), top))
        if cell not in seen and cell not in peer.holes:
          nxt.add(cell)
    seen |= nxt
    frontier, depth = nxt, depth + 1
  return depth


@pytest.mark.parametrize("name", ["sokoban", "frozen_lake"])
def test_expert_replies_replay_to_success_in_the_reference_rules(name):
  setup, cfg, traj, states = expert_run(name)
  names = setup.env.spec.action_names
  budget = cfg.max_actions_per_traj
  for b in range(EPISODES):
    s = index(states, b)
    peer = peer_of(name, setup.env.jittable, s)
    length = shortest(name, setup.env.jittable, s, peer)
    replies = replies_of(traj, setup.tokenizer, b)
    for reply in replies:
      matched, actions = read_reply(reply, cfg, names)
      assert matched and actions and min(actions) >= 0, reply
      for a in actions:
        peer.step(a)
    solved = peer.solved() if name == "sokoban" else peer.player == peer.goal
    assert solved == (length <= budget), b
    assert bool(traj.success[b]) == solved
    if solved:
      assert int(traj.num_actions[b]) == length  # a shortest solution
      assert len(replies) == -(-length // cfg.max_actions_per_turn)


def test_sudoku_replies_spell_each_move_as_its_cell_then_its_digit():
  setup = assembly.build(
    small(sudoku_4x4.get_config(None), **{"sft.max_turns": 6})
  )
  key = jax.random.key(7)
  cfg, traj, found = expert_episodes(setup, key)
  states = to_numpy(rollout.reset(setup.env, cfg, rollout.reset_key(key)))
  traj, tok = to_numpy(traj), setup.tokenizer
  cells = {f"r{r}c{c}=" for r in range(1, 5) for c in range(1, 5)}
  assert np.asarray(found).all()
  for b in range(EPISODES):
    pieces = [tok.decode([t]) for t in traj.tokens[b][traj.loss_mask[b]]]
    moves = [i for i, p in enumerate(pieces) if p in cells]
    assert moves and all(pieces[i + 1] in "1234" for i in moves), pieces
    game = ref.Sudoku(
      index(states, b).board.reshape(4, 4).tolist(), box=2, max_steps=100
    )
    for reply in replies_of(traj, tok, b):
      matched, actions = read_reply(reply, cfg, setup.env.spec.action_names)
      assert matched and min(actions) >= 0, reply
      for a in actions:
        assert game.step(a // 16, a // 4 % 4, a % 4 + 1).valid, (b, reply)
    assert game.solved() and bool(traj.success[b]), b
    assert len(moves) == int(traj.num_actions[b])


@functools.cache
def sft_step():
  setup = assembly.build(small(sokoban.get_config(None)))
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  # Every call of this step in the tests must reuse its one trace.
  with traced_at_most_once(sft, "make_sft_step"):
    return setup, learner, assembly.compile_sft_step(setup, state, learner)


def test_the_warm_start_step_compiles_once_and_imitates():
  setup, learner, step = sft_step()
  state = assembly.init_state(setup, learner)
  losses = []
  for _ in range(4):
    state, metrics = step(state, setup.codec)
    losses.append(float(metrics["sft/loss"]))
  assert int(state.step) == 4
  # One turn of two actions solves the levels with the shortest solutions.
  assert 0.05 < float(metrics["sft/expert_success"]) < 0.5
  assert losses[-1] < losses[0] - 0.2


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(name="bandit"), "planner"),
    ({"sft.expert": "oracle"}, "expert"),
    ({"rollout.enable_think": True, "sft.max_turns": 2}, "first turns"),
    ({"sft.reasoning": "board"}, "enable_think=True"),
    (
      {
        "rollout.enable_think": True,
        "sft.reasoning": "board",
        "sft.expert": "world_model",
        "sft.max_turns": 2,
      },
      "world model has none",
    ),
    ({"rollout.enable_think": True}, "reasoning_tokens"),
    ({"rollout.max_new_tokens": 3}, "max_new_tokens"),
    ({"sft.max_turns": 0}, "max_turns"),
  ],
)
def test_impossible_warm_starts_are_refused_before_compiling(change, message):
  c = small(sokoban.get_config(None))
  if "name" in change:
    c = small(bandit.get_config(None), **{"sft.expert": "planner"})
  else:
    for key, value in change.items():
      section, name = key.split(".")
      c[section][name] = value
  with pytest.raises(assembly.ConfigError, match=message):
    assembly.build(c)


def think_setup():
  """The tiny Sokoban config in think mode: room for 6 tokens of the
  policy's own reasoning before a two-action answer."""
  c = small(sokoban.get_config(None), **{"rollout.enable_think": True})
  # Any text (the reasoning), not only the tokens answers are made of.
  c.rollout.answer_vocab = False
  c.rollout.max_new_tokens = 24
  c.sft.reasoning_tokens = 6
  return assembly.build(c)


def test_an_environment_that_writes_no_reasoning_is_refused():
  c = small(bandit.get_config(None), **{"sft.expert": "random_valid"})
  c.rollout.enable_think = True
  c.sft.reasoning = "board"
  with pytest.raises(assembly.ConfigError, match="writes no reasoning"):
    assembly.build(c)


def board_setup():
  """The tiny FrozenLake config in think mode, imitating three whole
  turns, each reply reasoning from its board (``sft.reasoning``)."""
  c = small(
    frozen_lake.get_config(None),
    **{
      "rollout.enable_think": True,
      "sft.reasoning": "board",
      "sft.max_turns": 3,
    },
  )
  c.rollout.answer_vocab = False
  # The tiny tokenizer spells text a character a token.
  c.rollout.max_new_tokens = 160
  c.rollout.max_context = 1024
  return assembly.build(c)


def test_board_reasoning_opens_every_turn_and_only_replies_are_imitated():
  setup = board_setup()
  tok, env = setup.tokenizer, setup.env.jittable
  cfg = sft.episodes_config(setup.config.rollout, setup.config.sft, setup.codec)
  replies = warm_start_replies(tok, setup.env, True)
  key = jax.random.key(5)
  traj, found = jax.jit(
    lambda codec, key: experts.expert_trajectories(
      setup.env, codec, replies, cfg, key, expert=experts.ExpertPlay(board=True)
    )
  )(setup.codec, key)
  traj, found = to_numpy(traj), np.asarray(found)
  states = rollout.reset(setup.env, cfg, rollout.reset_key(key))
  names = env.spec.action_names
  # Three turns of two actions solve most levels, not all.
  assert found.all() and traj.success.mean() > 0.5
  later = 0
  for b in range(cfg.batch):
    peer = peer_of("frozen_lake", env, index(states, b))
    played = replies_of(traj, tok, b)
    for reply in played:
      thought = test_thoughts.FROZEN.match(reply.split("</think>")[0])
      assert thought is not None, reply
      assert (int(thought[1]), int(thought[2])) == peer.player, reply
      actions = thought[10].split(", ")
      # The loss covers the reply alone, exactly: no observation token.
      answer = "</think><answer>" + " || ".join(actions) + "</answer>"
      assert reply == thought[0] + answer
      matched, ids = ref_text.parse(
        ("<think>" + reply).encode(),
        think=True,
        markers=setup.codec.markers,
        max_actions=cfg.max_actions_per_turn,
        action_names=names,
      )
      assert matched and [names[a] for a in ids] == actions, reply
      for a in ids:
        peer.step(a)
    assert (peer.player == peer.goal) == traj.success[b]
    later += len(played) - 1
  assert later > 0  # turns after the first are imitated


def test_own_reasoning_stops_before_think_close_and_stop_tokens():
  setup = think_setup()
  tok, codec = setup.tokenizer, setup.codec
  replies = [
    "ab cd ef gh ij kl mn",  # longer than the budget: cut at 6 tokens
    "a b</think><answer>Up</answer>",  # closed: cut before </think>
    "a b c<|im_end|>",  # stopped: cut before the stop token
  ]
  scripts = [tok.encode(r) + [tok.eos_id] * 8 for r in replies]
  width = max(len(x) for x in scripts)
  table = np.asarray([x + [tok.eos_id] * (width - len(x)) for x in scripts])
  cfg = dataclasses.replace(
    sft.episodes_config(setup.config.rollout, setup.config.sft, codec),
    env_groups=3,
  )
  policy = experts.ScriptedPolicy(
    jax.numpy.asarray(table), codec.token_bytes.shape[0]
  )
  ids, length = jax.jit(
    lambda codec, key: experts.own_reasoning(
      policy, codec, setup.env, cfg, key, 6, 1.0
    )
  )(codec, jax.random.key(0))
  ids, length = np.asarray(ids), np.asarray(length)
  want = [
    tok.encode(replies[0])[:6],
    tok.encode("a b"),
    tok.encode("a b c"),
  ]
  for b, w in enumerate(want):
    assert list(ids[b, : length[b]]) == w, (b, tok.decode(ids[b]))


def test_think_mode_experts_reason_then_answer_in_the_format():
  setup = think_setup()
  tok = setup.tokenizer
  cfg = sft.episodes_config(setup.config.rollout, setup.config.sft, setup.codec)
  replies = experts.Replies.build(tok, setup.env.spec, True)
  reasoning = np.tile(np.asarray(tok.encode("I push it up")), (cfg.batch, 1))
  length = np.arange(cfg.batch) % (reasoning.shape[1] + 1)
  key = jax.random.key(3)
  traj, found = jax.jit(
    lambda codec, key, r, n: experts.expert_trajectories(
      setup.env, codec, replies, cfg, key, reasoning=(r, n)
    )
  )(setup.codec, key, reasoning, length)
  traj = to_numpy(traj)
  states = rollout.reset(setup.env, cfg, rollout.reset_key(key))
  horizon = cfg.max_actions_per_turn
  plans = np.asarray(
    jax.vmap(lambda s: setup.env.jittable.plan(s, cfg.max_actions_per_traj))(
      states
    ).actions
  )[:, :horizon]
  names = setup.env.spec.action_names
  for b in range(cfg.batch):
    if not found[b]:
      continue
    reply = replies_of(traj, tok, b)[0]
    own = tok.decode(reasoning[b, : length[b]])
    assert reply.startswith(own + "</think><answer>"), reply
    # RAGEN's grammar reads it, and its actions begin a shortest solution.
    data = b"<think>" + reply.encode()
    matched, actions = ref_text.parse(
      data,
      think=True,
      markers=setup.codec.markers,
      max_actions=cfg.max_actions_per_turn,
      action_names=names,
    )
    assert matched and traj.turn_format_ok[b, 0], reply
    assert ref_text.think_end(data) == len(b"<think>" + own.encode())
    # The planner's first actions, as without think mode.
    assert actions == [a for a in plans[b, : len(actions)]], reply


def test_think_mode_imitates_reasoning_and_answer():
  setup = think_setup()
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  cfg = sft.episodes_config(setup.config.rollout, setup.config.sft, setup.codec)
  replies = experts.Replies.build(setup.tokenizer, setup.env.spec, True)
  key = jax.random.key(4)

  def losses(params, codec):
    model = nnx.merge(learner.policy_def, params)
    r = experts.own_reasoning(model, codec, setup.env, cfg, key, 6, 1.0)
    traj, _ = experts.expert_trajectories(
      setup.env, codec, replies, cfg, key, reasoning=r
    )
    loss = sft.imitation_loss(
      params,
      learner.policy_def,
      traj,
      cfg.max_generated,
      Distribution(1.0, codec.allowed),
      64,
      traj.length > 0,
    )[0]
    positions, slots = logprobs.pack_generated(traj, cfg.max_generated)
    logp, _ = logprobs.sequence_logprobs(
      model, traj.tokens, positions, 1.0, codec.allowed, 64
    )
    return loss, logp, slots, r[1]

  got, logp, slots, own = jax.jit(losses)(state.policy, setup.codec)
  assert 0 < float(np.mean(own)) <= 6
  # Every reply token, the reasoning's included.
  np.testing.assert_allclose(
    got, -np.asarray(logp)[np.asarray(slots)].mean(), rtol=1e-5
  )


def test_think_mode_reasoning_comes_from_the_initial_policy():
  # The state keeps the initial policy (no KL here), and the warm start
  # leaves it as it was while the policy learns.
  setup = think_setup()
  assert setup.config.algo.kl_coef == 0
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  assert assembly.keeps_reference(setup, learner)
  initial = jax.tree.map(np.asarray, nnx.to_pure_dict(state.reference))
  step = assembly.compile_sft_step(setup, state, learner)
  for _ in range(2):
    state, metrics = step(state, setup.codec)
  metrics = jax.device_get(metrics)
  assert 0 < metrics["sft/own_reasoning_tokens"] <= 6
  assert np.isfinite(metrics["sft/loss"]) and int(state.step) == 2
  after = nnx.to_pure_dict(state.reference)
  jax.tree.map(np.testing.assert_array_equal, after, initial)
  moved = jax.tree.map(
    lambda a, b: not np.array_equal(a, b),
    nnx.to_pure_dict(state.policy),
    initial,
  )
  assert any(jax.tree.leaves(moved))


def test_script_spells_a_plan_turn_by_turn():
  setup, *_ = expert_run("sokoban")
  replies = experts.Replies.build(setup.tokenizer, setup.env.spec)
  plan = np.asarray([3, 0, 2, -1, -1, -1], np.int32)
  script = np.asarray(replies.script(plan, 2, 3))
  text = setup.tokenizer.decode(script[script > 0])
  assert text == "Right || Up</answer>Left</answer>"
  assert dataclasses.is_dataclass(replies)


def test_random_valid_demonstrations_name_only_offered_arms():
  c = small(bandit.get_config(None), **{"sft.expert": "random_valid"})
  c.sft.episodes = 128
  setup = assembly.build(c)
  _, traj, _ = expert_episodes(setup, jax.random.key(3), expert="random_valid")
  # Two of forty names are offered: every pull names one of them, the
  # risky one about half the time.
  assert np.asarray(traj.turn_valid)[:, 0].all()
  assert 0.35 < float(np.mean(traj.success)) < 0.65


@pytest.mark.parametrize("name", ["countdown", "qa"])
def test_free_text_warm_start_spells_the_environments_solution(name):
  module = {"countdown": countdown, "qa": qa}[name]
  setup = assembly.build(small(module.get_config(None)))
  key = jax.random.key(11)
  cfg, traj, _ = expert_episodes(setup, key)
  traj = to_numpy(traj)
  states = to_numpy(rollout.reset(setup.env, cfg, rollout.reset_key(key)))
  if name == "qa":
    kw = setup.config.env.kwargs
    answers = dataset.load(kw["source"], kw["split"], "", "", "").answers
  for b in range(EPISODES):
    (reply,) = replies_of(traj, setup.tokenizer, b)
    assert reply.endswith("</answer>"), reply
    text = reply.removesuffix("</answer>")
    if name == "countdown":
      # Scored by RAGEN's rules in exact fractions.
      nums = [int(v) for v in states.nums[b, : int(states.count[b])]]
      target = int(states.target[b])
      assert ref_countdown.reward(text.encode(), target, nums) == 1.0
    else:
      assert text == answers[int(states.question[b])]
    assert bool(traj.success[b]) and traj.rewards[b].sum() > 0


@pytest.mark.parametrize(
  "change, message",
  [
    ({"sft.expert": "random_valid"}, "free-text answers"),
    ({"rollout.max_new_tokens": 6}, "an answer of 12 pieces"),
  ],
)
def test_impossible_free_text_warm_starts_are_named(change, message):
  c = small(countdown.get_config(None), **change)
  with pytest.raises(assembly.ConfigError, match=message):
    assembly.build(c)


def world_model_run(steps: int = 0):
  c = small(
    sokoban.get_config(None),
    **{"sft.expert": "world_model", "sft.max_turns": 3},
  )
  c.sft.steps = max(steps, 1)
  return assembly.build(c)


def test_world_model_targets_are_the_environments_next_observations():
  setup = world_model_run()
  key = jax.random.key(5)
  cfg, traj, _ = expert_episodes(setup, key, expert="world_model")
  traj = to_numpy(traj)
  states = to_numpy(rollout.reset(setup.env, cfg, rollout.reset_key(key)))
  changed = np.asarray(jax.jit(sft.changed_tokens)(traj))
  names = setup.env.spec.action_names
  later = moved = 0
  for b in range(EPISODES):
    peer = peer_of("sokoban", setup.env.jittable, index(states, b))
    tok, turns = traj.tokens[b], traj.turn_ids[b]
    board = None
    for k, reply in enumerate(replies_of(traj, setup.tokenizer, b)):
      shown = setup.tokenizer.decode(tok[(turns == k) & ~traj.loss_mask[b]])
      # The prompt shows the board the reference rules reach by replaying
      # the replies before it (read back with RAGEN's grammar).
      before, board = board, peer.text("grid")
      assert board in shown, (b, k, shown)
      if k > 0:
        # The tokens marked changed are the cells the move changed.
        cells = [
          new for old, new in zip(before, board, strict=True) if old != new
        ]
        marked = [
          setup.tokenizer.decode([t]) for t in tok[changed[b] & (turns == k)]
        ]
        assert marked == cells, (b, k, marked, cells)
        moved += bool(cells)
      later += k > 0
      _, actions = read_reply(reply, cfg, names)
      for a in actions:
        peer.step(a)
  assert later >= EPISODES  # most episodes show two later boards
  assert moved > EPISODES // 2
  assert not changed[traj.turn_ids < 1].any()


def test_world_model_warm_start_learns_to_predict_the_next_observation():
  setup = world_model_run(steps=12)
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  step = assembly.compile_sft_step(setup, state, learner)
  probs = []
  for _ in range(12):
    state, metrics = step(state, setup.codec)
    probs.append(float(metrics["sft/next_obs_prob"]))
  assert "sft/next_obs_exact" in metrics
  assert np.mean(probs[-3:]) > 3 * np.mean(probs[:3]), probs


def test_keeping_successes_imitates_only_the_episodes_that_succeeded():
  c = small(
    frozen_lake.get_config(None),
    **{"sft.expert": "random_valid", "sft.keep": "successes"},
  )
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  params = assembly.init_state(setup, learner).policy
  cfg, traj, _ = expert_episodes(
    setup, jax.random.key(2), expert="random_valid"
  )
  won = np.flatnonzero(np.asarray(traj.success))
  assert 0 < len(won) < EPISODES
  loss = lambda t, keep: sft.imitation_loss(
    params,
    learner.policy_def,
    t,
    cfg.max_generated,
    Distribution(setup.config.rollout.temperature, setup.codec.allowed),
    setup.config.algo.logits_chunk,
    keep,
  )[0]
  kept = loss(traj, traj.success)
  # The same as the loss over the winning episodes alone.
  alone = jax.tree.map(lambda x: x[won], traj)
  assert_close_at_scale(kept, loss(alone, alone.success))
  assert abs(float(kept) - float(loss(traj, traj.length > 0))) > 1e-4


def test_search_imitates_the_first_moves_of_a_success_it_found():
  c = small(
    frozen_lake.get_config(None),
    **{"sft.expert": "search", "sft.search_tries": 2},
  )
  setup = assembly.build(c)
  key = jax.random.key(5)
  cfg, traj, found = expert_episodes(setup, key, expert="search")
  traj, found = to_numpy(traj), np.asarray(found)
  states = to_numpy(rollout.reset(setup.env, cfg, rollout.reset_key(key)))
  # Two random episodes a level: some levels have no success to imitate.
  assert 0 < found.sum() < EPISODES
  budget = setup.config.rollout.max_actions_per_traj
  for b in np.flatnonzero(found):
    peer = peer_of("frozen_lake", setup.env.jittable, index(states, b))
    (reply,) = replies_of(traj, setup.tokenizer, b)
    matched, actions = read_reply(reply, cfg, setup.env.spec.action_names)
    assert matched and actions, reply
    for a in actions:
      peer.step(a)
    # The moves begin a success: off the holes, the goal still in reach.
    assert peer.player not in peer.holes
    rest = dataclasses.replace(peer, start=peer.player)
    assert (
      len(actions) + shortest("frozen_lake", setup.env.jittable, None, rest)
      <= budget
    )
