"""The compiled multi-turn rollout: scripted and random policies."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs.jax.sokoban import solve
from reference import countdown as ref_countdown
from reference import envs as ref_envs
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo.experts import ScriptedPolicy
from starpo_jax.models import presets, sampling, transformer
from tests.envs.conftest import index, to_numpy
from tests.helpers import TRACES, counted
from tests.text_fixtures import TOKENIZERS

CFG = rollout.RolloutConfig(
  env_groups=2,
  group_size=3,
  max_turns=6,
  max_actions_per_turn=2,
  max_actions_per_traj=12,
  max_new_tokens=40,
  max_context=1536,
  temperature=0.0,
)


@functools.cache
def runner(env_name: str, cfg: rollout.RolloutConfig, **kwargs):
  env = envs.make(env_name, **kwargs)
  play = jax.jit(
    lambda policy, codec, key: rollout.rollout(policy, codec, env, cfg, key)
  )
  return env, play


def initial_states(env, cfg, key):
  reset = jax.jit(lambda k: rollout.reset(env, cfg, k))
  return to_numpy(reset(rollout.reset_key(key)))


def script_from(replies: list[list[str]], tok) -> jnp.ndarray:
  rows = [[t for r in turns for t in tok.encode(r)] for turns in replies]
  width = max(len(r) for r in rows) + 1
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return jnp.asarray(out)


def replies_by_turn(traj, tok, b: int) -> list[str]:
  tokens = np.asarray(traj.tokens[b])
  mask = np.asarray(traj.loss_mask[b])
  turns = np.asarray(traj.turn_ids[b])
  return [
    tok.decode(tokens[mask & (turns == k)])
    for k in range(int(np.max(turns)) + 1)
  ]


@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
def test_scripted_solution_solves_sokoban_with_ragens_rewards(tok_name):
  tok = TOKENIZERS[tok_name]()
  env, play = runner("sokoban", CFG)
  codec = codec_lib.Codec.build(tok, env.spec, CFG.prompt_settings())
  key = jax.random.key(11)
  states = initial_states(env, CFG, key)
  names = env.spec.action_names
  styles = ["{} || {}", "{}||{}", " {} ||  {} ", "{}   ||{}"]
  replies, expected, lengths = [], [], []
  for b in range(CFG.batch):
    s = index(states, b)
    solution = solve(s.walls, s.targets, s.boxes, int(s.player), env.cols)
    lengths.append(len(solution))
    assert len(solution) <= CFG.max_turns * CFG.max_actions_per_turn
    peer = ref_envs.Sokoban(
      walls={divmod(int(i), env.cols) for i in np.flatnonzero(s.walls)},
      targets={divmod(int(i), env.cols) for i in np.flatnonzero(s.targets)},
      boxes={divmod(int(i), env.cols) for i in np.flatnonzero(s.boxes)},
      player=divmod(int(s.player), env.cols),
      rows=env.rows,
      cols=env.cols,
      max_steps=env.max_steps,
    )
    turns, rewards = [], []
    for k in range(0, len(solution), 2):
      chunk = solution[k : k + 2]
      spelled = [
        names[a].upper() if (k + b) % 3 == 0 else names[a] for a in chunk
      ]
      answer = (
        styles[(k // 2 + b) % 4].format(*spelled)
        if len(chunk) == 2
        else spelled[0]
      )
      turns.append(
        f"Turn {k // 2}: pushing.</think>\n<answer>{answer}</answer>"
      )
      rewards.append(sum(peer.step(a).reward for a in chunk))
    assert peer.solved()
    replies.append(turns)
    expected.append(rewards)
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(play(policy, codec, key))
  for b in range(CFG.batch):
    n = len(expected[b])
    np.testing.assert_allclose(traj.turn_rewards[b, :n], expected[b], atol=1e-5)
    assert traj.turn_played[b, :n].all() and not traj.turn_played[b, n:].any()
    assert traj.turn_valid[b, :n].all() and not traj.turn_penalized[b].any()
    assert traj.success[b] and traj.terminated[b] and not traj.truncated[b]
    assert replies_by_turn(traj, tok, b) == replies[b]
    # Each turn's reward sits on its reply's last token.
    ends = [
      np.flatnonzero(traj.loss_mask[b] & (traj.turn_ids[b] == k))[-1]
      for k in range(n)
    ]
    np.testing.assert_allclose(traj.rewards[b, ends], expected[b], atol=1e-5)
    assert traj.rewards[b].sum() == pytest.approx(
      traj.episode_return[b], abs=1e-5
    )
  np.testing.assert_array_equal(traj.num_actions, lengths)


def test_scripted_bandit_pulls_the_risky_arm_in_one_turn():
  tok = TOKENIZERS["compact"]()
  env, play = runner("bandit", CFG)
  codec = codec_lib.Codec.build(tok, env.spec, CFG.prompt_settings())
  key = jax.random.key(5)
  states = initial_states(env, CFG, key)
  names = env.spec.action_names
  replies = [
    [f"risky pays more</think><answer> {names[h].lower()} </answer>"]
    for h in states.high
  ]
  traj = to_numpy(
    play(ScriptedPolicy(script_from(replies, tok), tok.vocab_size), codec, key)
  )
  assert traj.success.all() and traj.terminated.all()
  assert traj.turn_played[:, 0].all() and not traj.turn_played[:, 1:].any()
  assert set(np.unique(traj.episode_return)) <= {0.0, 1.0}


def test_scripted_countdown_answers_are_scored_from_their_text():
  """A free-text answer reaches the environment whole: RAGEN's Countdown
  rewards, and the format penalty for a blank answer."""
  tok = TOKENIZERS["bpe"]()
  cfg = dataclasses.replace(
    CFG, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1
  )
  env, play = runner("countdown", cfg)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  key = jax.random.key(3)
  states = initial_states(env, cfg, key)
  answers, expected = [], []
  for b in range(cfg.batch):
    nums = [int(v) for v in states.nums[b, : int(states.count[b])]]
    target = int(states.target[b])
    answer = [
      ref_countdown.solve(nums, target),
      " + ".join(map(str, nums)) + " + 0",
      " + ".join(map(str, nums)) + " * 1)",
      " ",
      "<think>(" + " - ".join(map(str, nums)) + ")",
      "-".join(map(str, reversed(nums))),
    ][b]
    answers.append(answer)
    content = answer.replace("<think>", "")
    blank = not content.strip()
    reward = ref_countdown.reward(content.encode(), target, nums)
    expected.append(cfg.format_penalty if blank else reward)
  replies = [[f"sum them</think><answer>{a}</answer>"] for a in answers]
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(play(policy, codec, key))
  np.testing.assert_allclose(traj.turn_rewards[:, 0], expected, atol=1e-6)
  assert expected[0] == 1.0 and traj.success[0]
  assert list(traj.turn_penalized[:, 0]) == [a == " " for a in answers]
  assert list(traj.num_actions) == [int(a != " ") for a in answers]


def test_scripted_qa_answers_earn_one_then_a_half(tmp_path):
  """A question rendered as tokens, answers read from their text: right at
  once earns 1, right after a wrong answer 1/2 (RAGEN's), a blank answer
  the format penalty and no turn of the environment's."""
  rows = [
    {"question": f"What is {i} times 3?", "answer": f"so #### {3 * i}"}
    for i in range(1, 30)
  ]
  path = tmp_path / "qa.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  tok = TOKENIZERS["bpe"]()
  cfg = dataclasses.replace(
    CFG, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3
  )
  env, play = runner(
    "qa", cfg, source=str(path), data_dir=str(tmp_path), turns=2
  )
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  key = jax.random.key(2)
  states = initial_states(env, cfg, key)
  script = [  # per episode: its answers, and the rewards they earn
    (["{}"], [1.0]),
    (["0", " {} "], [0.0, 0.5]),
    ([" ", "{}"], [cfg.format_penalty, 1.0]),
    (["1", "2"], [0.0, 0.0]),
    (["{}0", "x"], [0.0, 0.0]),
    (["{}", "{}"], [1.0]),
  ]
  replies, questions = [], []
  for b, (answers, _) in enumerate(script):
    question = env.spec.pieces[int(env.render(index(states, b))[0][0])]
    questions.append(question)
    right = str(3 * int(question.split()[2]))
    replies.append(
      [f"hm</think><answer>{a.format(right)}</answer>" for a in answers]
    )
  traj = to_numpy(
    play(ScriptedPolicy(script_from(replies, tok), tok.vocab_size), codec, key)
  )
  for b, (_, rewards) in enumerate(script):
    n = len(rewards)
    np.testing.assert_allclose(traj.turn_rewards[b, :n], rewards, atol=1e-6)
    assert not traj.turn_played[b, n:].any()
    assert traj.success[b] == (max(rewards) > 0)
    seen = tok.decode(traj.tokens[b][: int(traj.length[b])])
    assert questions[b] in seen
    assert ("Incorrect. Please think again." in seen) == (rewards[0] == 0)
  assert list(traj.num_actions) == [1, 2, 1, 2, 2, 1]


def test_mixed_answers_budgets_and_the_chat_stop_token():
  """Three README claims on one scripted batch (groups share a level): an
  answer mixing valid and invalid parts plays the valid ones and costs the
  format penalty; the per-episode action budget cuts an answer short and
  ends the episode; a reply that emits the chat's end-of-turn token stops
  there (no answer: the penalty) and the next turn follows at once."""
  tok = TOKENIZERS["compact"]()
  cfg = dataclasses.replace(CFG, max_turns=3, max_actions_per_traj=3)
  env, play = runner("sokoban", cfg)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  stop = tok.chat.stop
  ok = "ok</think><answer>{}</answer>"
  replies = [
    [ok.format("Up || Jump")],
    [ok.format("Up")],
    [ok.format("Up || Up")] * 3,
    [f"hm{stop}", ok.format("Up")],
    [ok.format("Jump")],
    [ok.format("Up"), f"no{stop}", ok.format("Up")],
  ]
  replies = [r + [ok.format("Jump")] * (3 - len(r)) for r in replies]
  traj = to_numpy(
    play(
      ScriptedPolicy(script_from(replies, tok), tok.vocab_size),
      codec,
      jax.random.key(4),
    )
  )
  up = env.spec.action_names.index("Up")
  penalty = cfg.format_penalty
  # Mixed: the same move as its group's plain "Up", plus the penalty.
  assert traj.turn_actions[0, 0, 0] == up and traj.turn_actions[0, 0, 1] == -1
  assert traj.turn_penalized[0, 0] and not traj.turn_penalized[1, 0]
  assert traj.turn_rewards[0, 0] == pytest.approx(
    traj.turn_rewards[1, 0] + penalty
  )
  # Budget: 3 actions, then the episode ends after its second turn.
  assert traj.num_actions[2] == 3
  assert list(traj.turn_actions[2, 1]) == [up, -1]
  assert list(traj.turn_played[2]) == [True, True, False]
  # The chat's end-of-turn token ends the reply: no answer, the penalty,
  # one end-of-turn token in the context, and the next turn plays "Up".
  for b, k in ((3, 0), (5, 1)):
    assert traj.turn_penalized[b, k] and traj.turn_rewards[b, k] == penalty
    assert replies_by_turn(traj, tok, b)[k].endswith(stop)
    assert traj.turn_actions[b, k + 1, 0] == up
    seen = tok.decode(traj.tokens[b][: int(traj.length[b])])
    # Every message closed once: the system's, each user's, each reply's
    # but the last (the context ends there).
    assert seen.count(stop) == 2 * seen.count(tok.chat.start("user"))
  assert traj.turn_rewards[3, 1] == pytest.approx(traj.turn_rewards[1, 0])


def test_garbage_gets_the_format_penalty_every_turn_without_nan():
  tok = TOKENIZERS["compact"]()
  cfg = CFG
  env, play = runner("sokoban", cfg)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  rng = np.random.default_rng(0)
  # Uniformly random token ids, chat markers and tags included.
  script = jnp.asarray(rng.integers(0, tok.vocab_size, (cfg.batch, 400)))
  traj = to_numpy(
    play(ScriptedPolicy(script, tok.vocab_size), codec, jax.random.key(1))
  )
  played = traj.turn_played
  assert played.sum() >= cfg.batch * 2
  np.testing.assert_array_equal(traj.turn_penalized, played)
  np.testing.assert_allclose(traj.turn_rewards[played], cfg.format_penalty)
  assert np.isfinite(traj.episode_return).all()
  assert not traj.success.any()
  # No valid action, so the next observation carries RAGEN's warning.
  first = tok.decode(traj.tokens[0, : traj.length[0]])
  if played[0, 1]:
    assert "No valid action provided previously." in first


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_an_uncached_forward(temperature):
  tok = TOKENIZERS["compact"]()
  cfg = rollout.RolloutConfig(
    env_groups=2,
    group_size=2,
    max_turns=3,
    max_new_tokens=16,
    max_context=768,
    temperature=temperature,
  )
  env, play = runner("sokoban", cfg)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  traj = play(model, codec, jax.random.key(2))
  logits = jax.jit(lambda m, t: m(t)[0])(model, traj.tokens)
  logp = sampling.policy_logprobs(logits, temperature)[:, :-1]
  want = jnp.take_along_axis(logp, traj.tokens[:, 1:, None], axis=-1)[..., 0]
  mask = np.asarray(traj.loss_mask[:, 1:])
  assert mask.sum() > 20
  got = np.asarray(traj.logprobs[:, 1:])[mask]
  np.testing.assert_allclose(got, np.asarray(want)[mask], atol=1e-5)
  assert not np.asarray(traj.loss_mask[:, 0]).any()


def test_group_members_share_a_level_and_groups_differ():
  env = envs.make("sokoban")
  cfg = rollout.RolloutConfig(env_groups=4, group_size=3)
  states = initial_states(env, cfg, jax.random.key(7))
  boxes = states.boxes.reshape(4, 3, -1)
  player = states.player.reshape(4, 3)
  assert (boxes == boxes[:, :1]).all() and (player == player[:, :1]).all()
  assert (
    len({(tuple(b[0]), p[0]) for b, p in zip(boxes, player, strict=True)}) > 1
  )
  assert len({tuple(k) for k in states.key}) == cfg.batch


def test_a_full_context_ends_the_episode_as_truncated():
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  settings = CFG.prompt_settings()
  codec = codec_lib.Codec.build(tok, env.spec, settings)
  system = len(codec.fragments.system)
  chunk = codec.turn_chunk_size(CFG.max_turns, CFG.max_actions_per_traj)
  cfg = rollout.RolloutConfig(
    env_groups=1,
    group_size=2,
    max_turns=6,
    max_new_tokens=40,
    max_context=system + chunk + 30,
    temperature=0.0,
  )
  _, play = runner("sokoban", cfg)
  # Valid but useless answers: every turn keeps the episode going.
  replies = [["wait</think><answer>Up</answer>"] * 6] * 2
  traj = to_numpy(
    play(
      ScriptedPolicy(script_from(replies, tok), tok.vocab_size),
      codec,
      jax.random.key(0),
    )
  )
  assert traj.context_truncated.all() and traj.truncated.all()
  assert (traj.length <= cfg.max_context).all()
  assert traj.num_turns.max() < cfg.max_turns
  with pytest.raises(ValueError, match=r"max_context=.* is too small"):
    small = rollout.RolloutConfig(max_context=system + 5)
    rollout.rollout(
      ScriptedPolicy(jnp.zeros((small.batch, 1), jnp.int32), tok.vocab_size),
      codec,
      env,
      small,
      jax.random.key(0),
    )


def test_the_context_holds_the_system_prompt_and_one_turn_exactly():
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  codec = codec_lib.Codec.build(tok, env.spec, CFG.prompt_settings())
  system = len(codec.fragments.system)
  chunk = codec.turn_chunk_size(CFG.max_turns, CFG.max_actions_per_traj)

  def trace(max_context):
    cfg = dataclasses.replace(CFG, env_groups=1, max_context=max_context)
    policy = ScriptedPolicy(
      jnp.zeros((cfg.batch, 1), jnp.int32), tok.vocab_size
    )
    jax.eval_shape(
      lambda key: rollout.rollout(policy, codec, env, cfg, key),
      jax.random.key(0),
    )

  trace(system + chunk + 1)  # the least that fits
  with pytest.raises(ValueError, match=f"need {system + chunk + 1}"):
    trace(system + chunk)


def test_rollout_of_128_episodes_compiles_once_without_host_callbacks():
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  cfg = rollout.RolloutConfig(
    env_groups=16,
    group_size=8,
    max_turns=2,
    max_new_tokens=8,
    max_context=640,
  )
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  fn = counted("rollout128", lambda m, c, k: rollout.rollout(m, c, env, cfg, k))
  play = jax.jit(fn)
  first = play(model, codec, jax.random.key(0))
  second = play(model, codec, jax.random.key(1))
  assert TRACES["rollout128"] == 1
  assert first.tokens.shape == (128, cfg.max_context)
  assert not np.array_equal(np.asarray(first.tokens), np.asarray(second.tokens))
  jaxpr = str(jax.make_jaxpr(fn)(model, codec, jax.random.key(0)))
  assert "callback" not in jaxpr
  assert np.isfinite(np.asarray(second.logprobs)).all()


def test_bandit_arm_not_offered_is_invalid_and_penalised():
  # RAGEN's lookup holds only the two offered arms: naming any other arm
  # is no valid action (format penalty, warning), never a free no-op.
  tok = TOKENIZERS["compact"]()
  cfg = dataclasses.replace(CFG, max_turns=2)
  env, play = runner("bandit", cfg)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  key = jax.random.key(6)
  states = initial_states(env, cfg, key)
  names = env.spec.action_names
  offered = [
    {int(lo), int(hi)} for lo, hi in zip(states.low, states.high, strict=True)
  ]
  other = [next(i for i in range(len(names)) if i not in o) for o in offered]
  replies = [
    [
      f"</think><answer>{names[o]}</answer>",
      f"</think><answer>{names[h]}</answer>",
    ]
    for o, h in zip(other, states.high, strict=True)
  ]
  traj = to_numpy(
    play(ScriptedPolicy(script_from(replies, tok), tok.vocab_size), codec, key)
  )
  assert traj.turn_penalized[:, 0].all() and not traj.turn_valid[:, 0].any()
  np.testing.assert_allclose(traj.turn_rewards[:, 0], cfg.format_penalty)
  # The episode goes on: the second turn pulls the offered risky arm.
  assert traj.turn_valid[:, 1].all() and traj.success.all()
  first = tok.decode(traj.tokens[0, : traj.length[0]])
  assert "No valid action provided previously." in first


def test_a_rollout_in_chunks_plays_the_same_episodes():
  # Greedy, so the sampling keys (one per chunk) do not matter: each chunk
  # of whole groups must play exactly what the whole batch plays.
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  cfg = rollout.RolloutConfig(
    env_groups=4,
    group_size=2,
    max_turns=3,
    max_new_tokens=8,
    max_context=640,
    temperature=0.0,
  )
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  whole = to_numpy(runner("sokoban", cfg)[1](model, codec, jax.random.key(3)))
  assert whole.loss_mask.sum() > 40
  for chunks in (2, 4):
    part = dataclasses.replace(cfg, chunks=chunks)
    got = to_numpy(runner("sokoban", part)[1](model, codec, jax.random.key(3)))
    for name in ("tokens", "length", "loss_mask", "turn_rewards", "success"):
      np.testing.assert_array_equal(
        getattr(got, name), getattr(whole, name), err_msg=name
      )
    np.testing.assert_allclose(got.logprobs, whole.logprobs, atol=1e-5)


def test_chunks_must_split_whole_groups_of_a_jittable_environment():
  with pytest.raises(ValueError, match="chunks=3 must divide the 4 groups"):
    rollout.RolloutConfig(env_groups=4, chunks=3)
  with pytest.raises(ValueError, match="chunks must be a positive integer"):
    rollout.RolloutConfig(chunks=0)
  tok = TOKENIZERS["compact"]()
  host = envs.batched(envs.make("gym_sokoban", levels="sokoban")).bind(
    tok.encode
  )
  cfg = rollout.RolloutConfig(env_groups=2, group_size=1, chunks=2)
  codec = codec_lib.Codec.build(tok, host.spec, cfg.prompt_settings())
  with pytest.raises(ValueError, match="chunks=2 needs a jittable environment"):
    rollout.rollout(
      ScriptedPolicy(jnp.zeros((2, 1), jnp.int32), tok.vocab_size),
      codec,
      host,
      cfg,
      jax.random.key(0),
    )
