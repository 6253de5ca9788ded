"""envs/host/textarena.py: TextArena's single-player games against the
same games run directly as TextArena's docs run them (same seeds, same
moves: the same messages, rewards and ends), episodes side by side as
each alone, refusals by name, and a game played through the compiled
rollout."""

from __future__ import annotations

import dataclasses
import random
import sys

import jax
import numpy as np
import pytest
import textarena

import envs
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo.experts import ScriptedPolicy
from tests.envs.conftest import to_numpy
from tests.envs.test_host import script_from
from tests.text_fixtures import TOKENIZERS

# Each game with the answers drawn from (a malformed one among them) and
# how the wrapper is told its moves.
GAMES = {
  "FrozenLake-v0": (
    ["up", "down", "left", "right", "jump"],
    "up,down,left,right",
  ),
  "GuessTheNumber-v0": ([str(n) for n in range(1, 21)] + ["x"], ""),
  "Minesweeper-v0-small": (
    [f"{r} {c}" for r in range(5) for c in range(5)],
    "",
  ),
  "TowerOfHanoi-v0": (["A C", "A B", "B C", "C A", "B A", "C B", "A"], ""),
}


def direct(game: str, seed: int, answers: list[str]):
  """The game as TextArena's README plays it: make, reset, then
  get_observation / step until done, and close for the rewards."""
  env = textarena.make(f"{game}-raw")
  env.reset(num_players=1, seed=seed)
  out = [env.get_observation()[1]]
  for answer in answers:
    done, _ = env.step(action=f"[{answer}]")
    out.append(env.get_observation()[1])
    if done:
      return out, env.close()[0][0]
  return out, None


def text(messages) -> str:
  return "\n".join(m for _, m, _ in messages).strip()


def moves(game: str, seed: int, n: int = 12) -> list[str]:
  pool = GAMES[game][0]
  return [
    pool[i] for i in np.random.default_rng(seed).integers(len(pool), size=n)
  ]


@pytest.mark.parametrize("game", sorted(GAMES))
def test_each_game_plays_as_textarena_runs_it(game):
  spec = envs.make("textarena", game=game, actions=GAMES[game][1])
  ended = 0
  for seed in range(6):
    answers = moves(game, seed)
    want, final = direct(game, seed, answers)
    episode = spec.make()
    assert episode.reset(seed) == text(want[0])
    for t, answer in enumerate(answers):
      obs, reward, done, info = episode.step(answer)
      assert obs == text(want[t + 1]), (seed, t)
      last = t + 2 == len(want) and final is not None
      assert done == last, (seed, t)
      assert reward == (final if done else 0.0), (seed, t)
      if done:
        assert info["success"] == (final >= 1.0)
        ended += 1
        break
  assert ended, f"no episode of {game} ended: the test checks no reward"


def test_episodes_side_by_side_play_as_each_alone():
  # Minesweeper lays its mines from Python's global random at the first
  # reveal, after both episodes have reset: without a stream of its own,
  # one episode's draws would move the other's.
  spec = envs.make("textarena", game="Minesweeper-v0-small")
  a, b = spec.make(), spec.make()
  random.seed(123)
  a.reset(1), b.reset(2)
  together = [(a.step(x)[0], b.step(x)[0]) for x in ("2 2", "0 0", "4 4")]
  for seed, side in ((1, 0), (2, 1)):
    alone = spec.make()
    alone.reset(seed)
    for x, pair in zip(("2 2", "0 0", "4 4"), together, strict=True):
      assert alone.step(x)[0] == pair[side]


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({}, "set game to a TextArena id"),
    ({"game": "FrozenLak-v0"}, "unknown game 'FrozenLak-v0' (did you mean"),
    ({"game": "TicTacToe-v0"}, "TicTacToe-v0 is not a single-player game"),
    ({"game": "FrozenLake-v0", "action_format": "[]"}, "needs {} where"),
    # Hangman downloads nltk's word list as it loads; none is here.
    ({"game": "Hangman-v0"}, "Hangman-v0 needs nltk's 'words', which it"),
  ],
)
def test_a_game_it_cannot_play_is_refused_by_name(
  monkeypatch, tmp_path, kwargs, message
):
  import nltk

  # As on a machine without nltk's data, whatever this one has.
  monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
  with pytest.raises(
    ValueError, match=message.replace("(", r"\(").replace("[", r"\[")
  ):
    envs.make("textarena", **kwargs)


def test_a_game_played_through_the_compiled_rollout_keeps_its_rewards():
  played = []

  class Recorded(type(envs.make("textarena", game="FrozenLake-v0").make())):
    def reset(self, seed, level=None):
      played.append({"seed": int(seed), "answers": []})
      self.record = played[-1]
      return super().reset(seed, level)

    def step(self, answer):
      self.record["answers"].append(answer)
      return super().step(answer)

  spec = envs.make(
    "textarena", game="FrozenLake-v0", actions="up,down,left,right"
  )
  spec = dataclasses.replace(
    spec, make=lambda: Recorded("FrozenLake-v0", "[{}]", {})
  )
  cfg = rollout.RolloutConfig(
    env_groups=2,
    group_size=2,
    max_turns=3,
    max_actions_per_turn=2,
    max_actions_per_traj=6,
    max_new_tokens=24,
    max_context=2048,
    temperature=0.0,
    enable_think=False,
  )
  tok = TOKENIZERS["compact"]()
  env = envs.batched(spec).bind(tok.encode)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  turns = ["<answer>down || right</answer>", "<answer>right || down</answer>"]
  replies = [[*turns, "<answer>right || right</answer>"]] * cfg.batch
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj = to_numpy(
    jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))(
      policy, codec, jax.random.key(0)
    )
  )
  # One episode per slot; a group's episodes share their level's seed.
  assert len(played) == cfg.batch
  assert len({r["seed"] for r in played}) == cfg.env_groups
  returns = []
  for record in played:
    _, final = direct("FrozenLake-v0", record["seed"], record["answers"])
    returns.append(final or 0.0)
  np.testing.assert_allclose(
    sorted(traj.episode_return), sorted(returns), atol=1e-6
  )
  shown = tok.decode(traj.tokens[0, : traj.length[0]])
  assert "Welcome to Frozen Lake!" in shown and "Current Board:" in shown


def test_episodes_in_the_bridges_threads_play_as_each_alone():
  # The bridge steps each episode's turn in a thread of its own; with the
  # interpreter switching threads every microsecond, the streams of
  # episodes laying their mines at once would mix without one at a time.
  spec = envs.make("textarena", game="Minesweeper-v0-hard", max_obs_tokens=4096)
  encode = lambda text: list(text.encode())
  slots = envs.batched(spec).bind(encode).slots
  b, move = 48, b"5 5"
  slots.reset(0, np.arange(b), None)
  answers = np.tile(np.frombuffer(move, np.uint8), (b, 1))
  previous = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    out = slots.act(
      0,
      np.zeros((b, 1), np.int32),
      answers,
      np.full((b,), len(move)),
      np.ones((b,), bool),
      np.zeros((b,), np.int32),
      1,
    )
  finally:
    sys.setswitchinterval(previous)
  for seed in range(b):
    alone = spec.make()
    alone.reset(seed)
    want = encode(alone.step(move.decode())[0])
    assert out["length"][seed] == len(want)
    assert out["obs"][seed, : len(want)].tolist() == want, seed
