"""The reasoning an expert writes about a board (``env.think``), read back
with a regular expression and held to the plain-Python peer's board: the
player, the goal or the boxes and targets, the holes beside the player, the
turn's actions and where they lead."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from envs.jax.frozen_lake.env import FrozenLake
from envs.jax.sokoban.env import Sokoban
from tests.helpers import peer_of

LEVELS = 24
PER_TURN, TURNS = 2, 3

CELL = r"\((\d), (\d)\)"
CELLS = r"((?:\(\d, \d\)(?:, )?)+)"
OFFSET = r"(?:: (?:(\d) (down|up))?(?: and )?(?:(\d) (right|left))?)?"


def cells(text: str) -> set[tuple[int, int]]:
  return {(int(r), int(c)) for r, c in re.findall(CELL, text)}


def offset(match, first: int) -> tuple[int, int]:
  """(rows, cols) of an offset the regex read from group ``first`` on."""
  rows, down, cols, right = match.group(first, first + 1, first + 2, first + 3)
  sign = lambda word, plus: 1 if word == plus else -1
  r = 0 if rows is None else int(rows) * sign(down, "down")
  c = 0 if cols is None else int(cols) * sign(right, "right")
  return r, c


def written(env, seed):
  """Each turn of a shortest plan from a new level: (the text, the turn's
  actions), and the level's first state."""
  state, _ = jax.jit(env.reset)(jax.random.key(seed))
  plan = jax.jit(env.plan, static_argnums=1)(state, PER_TURN * TURNS)
  plan = np.asarray(plan.actions)
  think, step = jax.jit(env.think), jax.jit(env.step)
  out, now = [], state
  for t in range(TURNS):
    chunk = plan[t * PER_TURN : (t + 1) * PER_TURN]
    if chunk[0] < 0:
      break
    after = now
    for a in chunk:
      after = step(after, a)[0]
    ids, n = think(now, chunk, after)
    text = "".join(env.thoughts.pieces[i] for i in np.asarray(ids)[: int(n)])
    out.append((text, [int(a) for a in chunk if a >= 0]))
    now = after
  return out, state


FROZEN = re.compile(
  rf"I am at {CELL}; the goal is at {CELL}{OFFSET}\. "
  rf"(?:Holes near me: {CELLS}\.|No hole near me\.) "
  rf"(\w+(?:, \w+)*) takes me to {CELL}\.$"
)


def test_frozen_lake_reasoning_reads_the_board_it_was_written_from():
  env = FrozenLake(success_rate=1.0)
  names = env.spec.action_names
  turns = 0
  for seed in range(LEVELS):
    played, state = written(env, seed)
    peer = peer_of("frozen_lake", env, state)
    for text, actions in played:
      m = FROZEN.match(text)
      assert m is not None, text
      player = (int(m.group(1)), int(m.group(2)))
      goal = (int(m.group(3)), int(m.group(4)))
      assert (player, goal) == (peer.player, peer.goal), text
      assert offset(m, 5) == (goal[0] - player[0], goal[1] - player[1]), text
      near = {
        h
        for h in peer.holes
        if abs(h[0] - player[0]) + abs(h[1] - player[1]) == 1
      }
      assert (cells(m.group(9)) if m.group(9) else set()) == near, text
      assert m.group(10).split(", ") == [names[a] for a in actions], text
      for a in actions:
        peer.step(a)
      assert (int(m.group(11)), int(m.group(12))) == peer.player, text
      turns += 1
  assert turns > LEVELS  # later turns are written too


SOKOBAN = re.compile(
  rf"I am at {CELL}(?:; boxes to push: {CELLS}; empty targets: {CELLS})?"
  rf"{OFFSET}\. (\w+(?:, \w+)*) takes me to {CELL}"
  rf"(?:, a box to {CELLS})?\.$"
)


def test_sokoban_reasoning_reads_the_board_it_was_written_from():
  env = Sokoban()
  names = env.spec.action_names
  pushes = 0
  for seed in range(LEVELS):
    played, state = written(env, seed)
    peer = peer_of("sokoban", env, state)
    for text, actions in played:
      m = SOKOBAN.match(text)
      assert m is not None, text
      assert (int(m.group(1)), int(m.group(2))) == peer.player, text
      loose, empty = peer.boxes - peer.targets, peer.targets - peer.boxes
      assert cells(m.group(3) or "") == loose, text
      assert cells(m.group(4) or "") == empty, text
      (box,), (target,) = peer.boxes, peer.targets
      assert offset(m, 5) == (target[0] - box[0], target[1] - box[1]), text
      assert m.group(9).split(", ") == [names[a] for a in actions], text
      before = set(peer.boxes)
      for a in actions:
        peer.step(a)
      assert (int(m.group(10)), int(m.group(11))) == peer.player, text
      assert cells(m.group(12) or "") == peer.boxes - before, text
      pushes += bool(m.group(12))
  assert pushes  # a push is written somewhere


@pytest.mark.parametrize("env", [FrozenLake(success_rate=1.0), Sokoban()])
def test_a_turn_without_actions_writes_no_action_names(env):
  state, _ = env.reset(jax.random.key(0))
  none = np.full((PER_TURN,), -1, np.int32)
  ids, n = env.think(state, none, state)
  text = "".join(env.thoughts.pieces[i] for i in np.asarray(ids)[: int(n)])
  assert not any(name in text for name in env.spec.action_names), text
