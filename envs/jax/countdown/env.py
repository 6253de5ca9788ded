"""Countdown as a pure, jittable text environment with RAGEN's rules.

One turn: the observation is ``Target: T, nums: [a, b, c]`` and the answer
is an arithmetic expression (``envs.jax.countdown.expression``), evaluated
inside ``jit`` from the answer's bytes. Reward as RAGEN's
``compute_reward``: ``score`` (1) when the expression uses exactly the
given numbers, each once, and equals the target; ``format_score`` (0.1)
when it uses exactly the given numbers but is wrong (division by zero is
wrong); else 0. Choices made here: a malformed expression scores 0 (RAGEN
checks the numbers with a regex before ``eval`` and so gives 0.1 to
``1+2)`` written with the right digits); values are float32 and "equals"
means within a relative 1e-6 (RAGEN: float64, absolute 1e-5); an answer
longer than ``max_answer_bytes`` is malformed.

Problems are generated inside ``jit`` so that one exists with each number
added or subtracted once (the family RAGEN keeps: its ``has_solution``
filter), or drawn from a fixed set loaded from a JSONL file with one
``{"target": T, "nums": [...]}`` per line.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core
from envs import tools as tools_lib
from envs.jax import render
from envs.jax.countdown import constants, expression, solver


@struct.dataclass
class State:
  nums: jax.Array  # [max_numbers] int32, 0 after `count`
  count: jax.Array  # [] int32 numbers in the problem
  target: jax.Array  # [] int32
  answered: jax.Array  # [] bool
  solved: jax.Array  # [] bool
  # A solution: generated problems keep the signs they were drawn with
  # ([max_numbers] +1/-1, 0 after `count`; zeros for a file's problem);
  # a file's problem keeps its row (-1 when generated).
  signs: jax.Array
  row: jax.Array
  key: jax.Array  # unused by the dynamics (they are deterministic)


class Countdown:
  """Countdown puzzles: one expression per episode."""

  def __init__(
    self,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 99,
    problems: str = "",
    score: float = 1.0,
    format_score: float = 0.1,
    max_answer_bytes: int = 128,
    tools: str = "",
  ) -> None:
    """Validates the settings before anything compiles.

    Args:
      min_numbers, max_numbers: how many numbers a generated problem has.
      max_number: generated numbers are drawn from 1..max_number.
      max_target: generated targets lie in 1..max_target.
      problems: a JSONL file of fixed problems; generated when empty.
      score: reward of a correct expression.
      format_score: reward of a wrong one that uses the right numbers.
      max_answer_bytes: longest answer evaluated.
      tools: tools the agent may call before it answers (``envs.tools``),
        comma-separated: ``"calculator"``.
    """
    _check(
      min_numbers=min_numbers,
      max_numbers=max_numbers,
      max_number=max_number,
      max_target=max_target,
      max_answer_bytes=max_answer_bytes,
    )
    self.problems = _load(problems, max_numbers) if problems else None
    self._solution_table: np.ndarray | None = None
    if self.problems is not None:
      max_number = int(self.problems[0].max())
      max_target = int(self.problems[1].max())
    self.min_numbers, self.max_numbers = min_numbers, max_numbers
    self.max_number, self.max_target = max_number, max_target
    self.rewards = (float(score), float(format_score))
    self.max_answer_bytes = max_answer_bytes
    table = render.PieceTable()
    self._digits = table.add_all([str(d) for d in range(10)])
    self._target, self._nums, self._sep, self._close = table.add_all(
      [constants.TARGET, constants.NUMS, constants.SEP, constants.CLOSE]
    )
    table.add_all(constants.ALPHABET)
    self._target_width = render.num_digits(max_target)
    self._number_width = render.num_digits(max_number)
    longest = 3 + self._target_width + max_numbers * (self._number_width + 1)
    self.spec = _spec(table.pieces, longest, tools)

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_problem, k_dynamics = jax.random.split(key)
    if self.problems is None:
      nums, signs, count, target = self._generate(k_problem)
      row = jnp.full((), -1, jnp.int32)
    else:
      table_nums, table_target, table_count = (
        jnp.asarray(a) for a in self.problems
      )
      row = jax.random.randint(k_problem, (), 0, table_target.shape[0])
      nums, count, target = table_nums[row], table_count[row], table_target[row]
      signs = jnp.zeros_like(nums)
    false = jnp.zeros((), bool)
    state = State(
      nums=nums,
      count=count,
      target=target,
      answered=false,
      solved=false,
      signs=signs,
      row=row,
      key=k_dynamics,
    )
    return state, core.TimeStep.first()

  def _generate(self, key: jax.Array):
    """Numbers and a target in 1..max_target that a sum of the numbers,
    each added or subtracted once, reaches; redrawn until one does."""
    m = self.max_numbers

    def draw(key):
      k_count, k_nums, k_signs = jax.random.split(key, 3)
      count = jax.random.randint(
        k_count, (), self.min_numbers, self.max_numbers + 1
      )
      live = jnp.arange(m) < count
      nums = jax.random.randint(k_nums, (m,), 1, self.max_number + 1)
      nums = jnp.where(live, nums, 0)
      signs = jnp.where(jax.random.bernoulli(k_signs, 0.5, (m,)), 1, -1)
      signs = jnp.where(live, signs, 0)
      return nums, signs, count, jnp.sum(signs * nums)

    def redraw(carry):
      key, *_ = carry
      key, sub = jax.random.split(key)
      return (key, *draw(sub))

    def bad(carry):
      target = carry[-1]
      return (target < 1) | (target > self.max_target)

    _, nums, signs, count, target = jax.lax.while_loop(
      bad, redraw, redraw((key, None, None, None, None))
    )
    return (
      nums.astype(jnp.int32),
      signs.astype(jnp.int32),
      count.astype(jnp.int32),
      target,
    )

  def step(
    self, state: State, answer: core.Answer
  ) -> tuple[State, core.TimeStep]:
    width = self.max_answer_bytes
    data = answer.data[:width]
    if data.shape[0] < width:
      data = jnp.pad(data, (0, width - data.shape[0]))
    r = expression.evaluate(data, answer.length, self.max_numbers)
    ok = r.ok & (answer.length <= width)
    live = jnp.arange(self.max_numbers) < state.count
    given = jnp.sort(jnp.where(live, state.nums, jnp.inf))
    used = jnp.sort(jnp.where(live, r.numbers, jnp.inf))
    right_numbers = ok & (r.count == state.count) & jnp.all(given == used)
    target = state.target.astype(jnp.float32)
    correct = (
      right_numbers
      & ~r.div_zero
      & (jnp.abs(r.value - target) <= 1e-6 * jnp.maximum(1.0, target))
    )
    score, format_score = self.rewards
    reward = jnp.where(
      correct, score, jnp.where(right_numbers, format_score, 0.0)
    )
    act = ~state.answered
    new = state.replace(answered=jnp.ones((), bool), solved=act & correct)
    new = jax.tree.map(lambda a, b: jnp.where(act, a, b), new, state)
    ts = core.TimeStep(
      reward=jnp.where(act, reward, 0.0).astype(jnp.float32),
      terminated=new.answered,
      truncated=jnp.zeros((), bool),
      success=new.solved,
      valid=jnp.ones((), bool),
      effective=act & (reward > 0),
    )
    return new, ts

  def random_answer(self, state: State, key: jax.Array) -> core.Answer:
    """The numbers in a random order joined by random operators, no
    parentheses: the right numbers, blind to the target."""
    k_order, k_ops = jax.random.split(key)
    m = self.max_numbers
    live = jnp.arange(m) < state.count
    # Live numbers first, in random order.
    order = jnp.argsort(jnp.where(live, jax.random.uniform(k_order, (m,)), 2))
    digits = jnp.asarray([ord(str(d)) for d in range(10)], jnp.int32)
    n_ids, n_keep = render.number(state.nums[order], digits, self._number_width)
    ops = jnp.asarray([ord(c) for c in "+-*/"], jnp.int32)
    op = ops[jax.random.randint(k_ops, (m, 1), 0, 4)]
    op_keep = ((jnp.arange(m) > 0) & (jnp.arange(m) < state.count))[:, None]
    ids = jnp.concatenate([op, n_ids], axis=1).reshape(-1)
    keep = jnp.concatenate([op_keep, n_keep & live[:, None]], axis=1)
    data, length = render.pack([(ids, keep.reshape(-1))], self.max_answer_bytes)
    return core.Answer(data=data, length=length)

  def solution(self, state: State) -> jax.Array:
    """A correct answer as ids into ``spec.answer_pieces``, ``-1`` after
    its end: a generated problem's numbers with the signs they were drawn
    with, added ones first (``"12 + 7 - 3"``); a file's problem solved on
    the host (``envs.jax.countdown.solver``) the first time this is traced."""
    if self.problems is not None:
      return jnp.asarray(self._solutions())[state.row]
    m, width = self.max_numbers, self._number_width
    live = jnp.arange(m) < state.count
    order = jnp.argsort(jnp.where(live, jnp.where(state.signs > 0, 0, 1), 2))
    signs = state.signs[order]
    piece = {p: i for i, p in enumerate(constants.ALPHABET)}
    n_ids, n_keep = render.number(state.nums[order], np.arange(10), width)
    op = jnp.where(signs > 0, piece[" + "], piece[" - "])[:, None]
    op_keep = ((jnp.arange(m) > 0) & live)[:, None]
    ids = jnp.concatenate([op, n_ids], axis=1).reshape(-1)
    keep = jnp.concatenate([op_keep, n_keep & live[:, None]], axis=1)
    out, n = render.pack([(ids, keep.reshape(-1))], m * (width + 1))
    return jnp.where(jnp.arange(out.shape[0]) < n, out, -1)

  def _solutions(self) -> np.ndarray:
    """Each file problem's solution as answer piece ids ``[P, W]``."""
    if self._solution_table is None:
      nums, targets, counts = self.problems
      rows = []
      for values, target, count in zip(nums, targets, counts, strict=True):
        values = [int(v) for v in values[:count]]
        text = solver.solve(values, int(target))
        if text is None:
          raise ValueError(
            f"countdown: problem target={int(target)}, nums={values} has no "
            "solution with + - * /; the warm start (sft.expert='planner') "
            "imitates one for every problem: remove it from the file"
          )
        rows.append(_answer_pieces(text))
      table = np.full((len(rows), max(map(len, rows))), -1, np.int32)
      for i, ids in enumerate(rows):
        table[i, : len(ids)] = ids
      self._solution_table = table
    return self._solution_table

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    t_ids, t_keep = render.number(
      state.target, self._digits, self._target_width
    )
    n_ids, n_keep = render.number(
      state.nums, self._digits, self._number_width
    )  # [M, width]
    m = self.max_numbers
    sep = jnp.full((m, 1), self._sep, jnp.int32)
    sep_keep = ((jnp.arange(m) > 0) & (jnp.arange(m) < state.count))[:, None]
    live = (jnp.arange(m) < state.count)[:, None]
    ids = jnp.concatenate([sep, n_ids], axis=1).reshape(-1)
    keep = jnp.concatenate([sep_keep, n_keep & live], axis=1).reshape(-1)
    return render.pack(
      [
        render.fixed([self._target]),
        (t_ids, t_keep),
        render.fixed([self._nums]),
        (ids, keep),
        render.fixed([self._close]),
      ],
      self.spec.max_obs_pieces,
    )


def _answer_pieces(text: str) -> list[int]:
  """``text`` as ids into the answer alphabet, longest piece first."""
  pieces = sorted(enumerate(constants.ALPHABET), key=lambda p: -len(p[1]))
  ids, at = [], 0
  while at < len(text):
    i, piece = next(p for p in pieces if text.startswith(p[1], at))
    ids.append(i)
    at += len(piece)
  return ids


def _load(path: str, max_numbers: int) -> tuple[np.ndarray, ...]:
  """A JSONL problem set -> nums ``[P, max_numbers]``, targets ``[P]``,
  counts ``[P]``; errors name the file and line."""
  if not os.path.isfile(path):
    raise ValueError(f"countdown: problems file {path!r} does not exist")
  nums, targets, counts = [], [], []
  with open(path) as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"countdown: {path}, line {line_no}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from None
      target, values = (
        row.get("target") if isinstance(row, dict) else None,
        row.get("nums") if isinstance(row, dict) else None,
      )
      if not (
        isinstance(target, int)
        and target >= 0
        and isinstance(values, list)
        and 1 <= len(values) <= max_numbers
        and all(isinstance(v, int) and v > 0 for v in values)
      ):
        raise ValueError(
          f'{where}: want {{"target": int >= 0, "nums": [1 to {max_numbers} '
          f"positive ints]}}, got {line.strip()[:80]!r}"
        )
      nums.append(values + [0] * (max_numbers - len(values)))
      targets.append(target)
      counts.append(len(values))
  if not targets:
    raise ValueError(f"countdown: problems file {path!r} has no problems")
  return (
    np.asarray(nums, np.int32),
    np.asarray(targets, np.int32),
    np.asarray(counts, np.int32),
  )


def _check(**sizes: int) -> None:
  """Raises ``ValueError`` naming a size that is not a positive integer,
  or fewer numbers allowed than required."""
  for name, value in sizes.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(
        f"countdown: {name} must be a positive integer, got {value!r}"
      )
  if sizes["min_numbers"] > sizes["max_numbers"]:
    raise ValueError(
      f"countdown: min_numbers={sizes['min_numbers']} exceeds "
      f"max_numbers={sizes['max_numbers']}"
    )


def _spec(pieces: tuple[str, ...], longest: int, tools: str) -> core.EnvSpec:
  """Countdown's spec: free-text answers over its alphabet, observations
  of at most ``longest`` pieces."""
  return core.EnvSpec(
    name="countdown",
    pieces=pieces,
    action_names=(),
    instructions=constants.INSTRUCTIONS,
    legend=(),
    list_actions=False,
    max_obs_pieces=longest,
    max_steps=1,
    text_answers=True,
    answer_pieces=constants.ALPHABET,
    tools=tools_lib.names(tools),
  )
