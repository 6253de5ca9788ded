"""Countdown: the jitted expression evaluator against Python's parser with
exact arithmetic, generated problems against a brute-force solver, and
rewards against RAGEN's rules (``reference/countdown.py``)."""

from __future__ import annotations

import functools
import json
import random
from fractions import Fraction

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs import core
from envs.jax.countdown import Countdown, expression, solver
from reference import countdown as ref
from tests.envs.conftest import to_numpy
from tests.helpers import assert_compiles_once

WIDTH = 96  # bytes an expression may take in these tests
SPACES = ["", "", "", " ", "  ", "\t", "\n"]
NOISE = [*"0123456789+-*/() x._|=", "**", "//", "1e3", "0x1"]


def expression_text(rng: random.Random, depth: int) -> str:
  """A random well-formed expression: literals (zeros, long ones now and
  then), signs, parentheses and the four operators, spaced at random."""
  sp = lambda: rng.choice(SPACES)
  if depth == 0 or rng.random() < 0.3:
    kind = rng.random()
    if kind < 0.05:
      return rng.choice(["0", "00", "000"])
    if kind < 0.1:
      return str(rng.randrange(10**6, 10**12))
    return str(rng.randrange(1, 101))
  if rng.random() < 0.15:
    return rng.choice("-+") + sp() + expression_text(rng, depth - 1)
  inner = (
    expression_text(rng, depth - 1)
    + sp()
    + rng.choice("+-*/")
    + sp()
    + expression_text(rng, depth - 1)
  )
  return f"({sp()}{inner}{sp()})" if rng.random() < 0.4 else inner


def mangled(rng: random.Random, text: str) -> str:
  """``text`` with a few characters deleted, inserted or swapped."""
  chars = list(text)
  for _ in range(rng.randint(1, 3)):
    i = rng.randrange(len(chars) + 1)
    action = rng.random()
    if action < 0.35 and i < len(chars):
      del chars[i]
    elif action < 0.8:
      chars.insert(i, rng.choice(NOISE))
    elif i + 1 < len(chars):
      chars[i], chars[i + 1] = chars[i + 1], chars[i]
  return "".join(chars)


def as_bytes(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
  data = np.zeros((len(texts), WIDTH), np.int32)
  for i, t in enumerate(texts):
    data[i, : len(t)] = list(t)
  return data, np.asarray([len(t) for t in texts], np.int32)


@functools.cache
def jitted_evaluate():
  return jax.jit(jax.vmap(lambda d, n: expression.evaluate(d, n, 8)))


def test_evaluator_agrees_with_python_on_thousands_of_expressions():
  rng = random.Random(0)
  texts = [
    # Hand-picked corners: precedence, associativity, signs, zeros,
    # division by zero (also when it is later divided away), Python's
    # own operators that the grammar leaves out, empty and blank input.
    "1+2*3", "(1+2)*3", "2-3-4", "8/2/2", "-3*2", "2*-3", "--3", "+3",
    "1/0", "1/(1/0)", "3/(5-5)", "007", "00", "0", "2**3", "7//2", "()",
    "(3+)", "3 4", "(1)(2)", "", "   ", "1+", "(1", "1)", "1.5", "1_000",
    "((((((((((1))))))))))", "- ( - 4 )", "99999999*99999999",
  ]  # fmt: skip
  while len(texts) < 4000:
    text = expression_text(rng, rng.randint(0, 4))
    if rng.random() < 0.35:
      text = mangled(rng, text)
    if len(text) <= WIDTH:
      texts.append(text)
  raw = [t.encode() for t in texts]
  got = to_numpy(jitted_evaluate()(*as_bytes(raw)))
  checked = {"ok": 0, "malformed": 0, "div_zero": 0}
  for i, text in enumerate(raw):
    want = ref.evaluate(text)
    assert bool(got.ok[i]) == want.ok, text
    checked["ok" if want.ok else "malformed"] += 1
    if not want.ok:
      continue
    assert int(got.count[i]) == len(want.numbers), text
    # Exact below 2**24; longer literals are read digit by digit in float32.
    recorded = want.numbers[:8]
    np.testing.assert_allclose(
      got.numbers[i, : len(recorded)], recorded, rtol=1e-6, err_msg=text
    )
    small = [k for k, v in enumerate(recorded) if v < 2**24]
    assert list(got.numbers[i, small]) == [recorded[k] for k in small], text
    if want.largest > 1e30:  # float32 overflows where Python does not
      continue
    assert bool(got.div_zero[i]) == want.div_zero, text
    checked["div_zero"] += want.div_zero
    if want.value is not None:
      error = abs(Fraction(float(got.value[i])) - want.value)
      assert error <= Fraction(1, 10**5) * max(1, want.largest), text
  assert checked["ok"] > 1500 and checked["malformed"] > 600
  assert checked["div_zero"] > 20


@functools.cache
def problems(seed: int = 0, n: int = 256):
  env = envs.make("countdown")
  keys = jax.random.split(jax.random.key(seed), n)
  states, _ = jax.jit(jax.vmap(env.reset))(keys)
  return env, states


def problem(states, i: int) -> tuple[int, list[int]]:
  count = int(states.count[i])
  return int(states.target[i]), [int(v) for v in states.nums[i, :count]]


def test_every_generated_problem_has_a_solution():
  env, states = problems()
  counts = set()
  for i in range(states.target.shape[0]):
    target, nums = problem(states, i)
    counts.add(len(nums))
    assert 1 <= target <= env.max_target and all(1 <= v <= 99 for v in nums)
    assert ref.solve(nums, target) is not None, (target, nums)
  assert counts == {3, 4}


def spelled(env, ids) -> str:
  return "".join(env.spec.answer_pieces[i] for i in np.asarray(ids) if i >= 0)


@pytest.mark.parametrize(
  "settings",
  [{}, dict(min_numbers=2, max_numbers=5, max_number=9, max_target=30)],
)
def test_generated_solutions_reach_the_target_with_exactly_the_numbers(
  settings,
):
  env = envs.make("countdown", **settings)
  keys = jax.random.split(jax.random.key(5), 512)
  states, _ = jax.jit(jax.vmap(env.reset))(keys)
  solutions = np.asarray(jax.jit(jax.vmap(env.solution))(states))
  assert solutions.dtype == np.int32 and solutions.min() >= -1
  for i in range(512):
    target, nums = problem(states, i)
    text = spelled(env, solutions[i])
    # Read back by Python's parser in exact fractions.
    got = ref.evaluate(text.encode())
    assert got.value == Fraction(target), (text, target, nums)
    assert sorted(got.numbers) == sorted(nums), (text, nums)
    assert not text.startswith((" ", "-")), text
    assert ref.reward(text.encode(), target, nums) == 1.0


def test_file_problems_are_solved_on_the_host_and_unsolvable_ones_named(
  tmp_path,
):
  rows = [
    {"target": 24, "nums": [2, 4, 5, 6]},  # needs * (no signed sum)
    {"target": 4, "nums": [10, 2, 3]},  # needs /
    {"target": 7, "nums": [3, 4]},
    {"target": 24, "nums": [3, 3, 8, 8]},  # 8/(3 - 8/3)
  ]
  path = tmp_path / "set.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows))
  env = envs.make("countdown", problems=str(path))
  keys = jax.random.split(jax.random.key(0), 64)
  states, _ = jax.jit(jax.vmap(env.reset))(keys)
  solutions = np.asarray(jax.jit(jax.vmap(env.solution))(states))
  seen = set()
  for i in range(64):
    target, nums = problem(states, i)
    text = spelled(env, solutions[i])
    assert ref.reward(text.encode(), target, nums) == 1.0, (text, nums)
    seen.add(text)
  assert len(seen) == 4 and "7" not in seen
  path.write_text(json.dumps({"target": 5, "nums": [1, 1]}))
  env = envs.make("countdown", problems=str(path))
  states, _ = jax.vmap(env.reset)(keys[:2])
  with pytest.raises(ValueError, match=r"target=5, nums=\[1, 1\] has no"):
    jax.vmap(env.solution)(states)


def test_the_host_solver_finds_a_solution_exactly_when_one_exists():
  rng = random.Random(0)
  found = 0
  for _ in range(400):
    nums = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
    target = rng.randint(0, 40)
    text = solver.solve(nums, target)
    assert (text is None) == (ref.solve(nums, target) is None), (nums, target)
    if text is not None:
      found += 1
      got = ref.evaluate(text.encode())
      assert got.value == target and sorted(got.numbers) == sorted(nums)
  assert 80 < found < 320
  # The generator's family first, spelled as it spells it.
  assert solver.solve([3, 10], 7) == "10 - 3"
  assert solver.solve([2, 4, 5, 6], 24) == "5*6 - (2 + 4)"


def test_observation_is_ragens_text():
  env, states = problems()
  pieces, n = jax.vmap(env.render)(states)
  for i in range(64):
    target, nums = problem(states, i)
    assert core.to_text(env.spec, pieces[i], n[i]) == (
      f"Target: {target}, nums: {nums}"
    )


def answers_for(rng: random.Random, target: int, nums: list[int]) -> list:
  """A correct answer, the right numbers combined at random, wrong
  numbers, and malformed text."""
  shuffled = rng.sample(nums, len(nums))
  joined = lambda values: "".join(
    (rng.choice("+-*/") + rng.choice(SPACES) if k else "") + str(v)
    for k, v in enumerate(values)
  )
  return [
    ref.solve(nums, target),
    joined(shuffled),
    joined(shuffled[:-1]),
    joined([*shuffled, rng.randrange(1, 100)]),
    mangled(rng, joined(shuffled)),
  ]


def step_all(env, states, texts: list[bytes]):
  data, lengths = as_bytes(texts)
  answers = core.Answer(jnp.asarray(data), jnp.asarray(lengths))
  return jax.jit(jax.vmap(env.step))(states, answers)


def test_rewards_follow_ragens_rules():
  env, states = problems()
  rng = random.Random(1)
  texts, index, want = [], [], []
  for i in range(states.target.shape[0]):
    target, nums = problem(states, i)
    for answer in answers_for(rng, target, nums):
      texts.append(answer.encode())
      index.append(i)
      want.append(ref.reward(answer.encode(), target, nums))
  batch = jax.tree.map(lambda x: x[np.asarray(index)], states)
  new, ts = step_all(env, batch, texts)
  got = np.asarray(ts.reward)
  for k, text in enumerate(texts):
    assert got[k] == pytest.approx(want[k]), (text, problem(states, index[k]))
  want = np.asarray(want)
  assert set(np.unique(want)) == {0.0, 0.1, 1.0}
  np.testing.assert_array_equal(np.asarray(ts.success), want == 1.0)
  np.testing.assert_array_equal(np.asarray(ts.effective), want > 0)
  assert np.all(np.asarray(ts.terminated))
  # Answering again changes nothing and pays nothing.
  _, again = step_all(env, new, texts)
  assert not np.any(np.asarray(again.reward))
  np.testing.assert_array_equal(np.asarray(again.success), want == 1.0)


@pytest.mark.parametrize(
  "answer, reward",
  [
    ("3/(5-5)", 0.1),  # division by zero is a wrong answer
    ("5 + 5 - 3", 1.0),
    (" ( 5+5 ) - 3\n", 1.0),
    ("5+5-3=7", 0.0),  # malformed (RAGEN's regex check would give 0.1)
    ("5+5-3)", 0.0),
    ("5+5-3-0", 0.0),  # a number not given
    ("5+5-3" + " " * 200, 0.0),  # longer than max_answer_bytes
  ],
)
def test_hand_made_answers(answer, reward, tmp_path):
  path = tmp_path / "one.jsonl"
  path.write_text(json.dumps({"target": 7, "nums": [5, 5, 3]}) + "\n")
  env = envs.make("countdown", problems=str(path))
  state, _ = env.reset(jax.random.key(0))
  data = np.zeros(256, np.int32)
  data[: len(answer)] = list(answer.encode())
  _, ts = env.step(state, core.Answer(jnp.asarray(data), len(answer)))
  assert float(ts.reward) == pytest.approx(reward)
  assert reward == ref.reward(answer.encode(), 7, [5, 5, 3])


def test_random_answer_uses_the_numbers_and_ignores_the_target():
  env, states = problems()
  keys = jax.random.split(jax.random.key(2), states.target.shape[0])
  answers = to_numpy(jax.jit(jax.vmap(env.random_answer))(states, keys))
  rewards = []
  for i in range(states.target.shape[0]):
    target, nums = problem(states, i)
    text = bytes(answers.data[i, : answers.length[i]].astype(np.uint8))
    reward = ref.reward(text, target, nums)
    assert reward in (0.1, 1.0), text
    rewards.append(reward)
  assert 0 < np.mean(np.asarray(rewards) == 1.0) < 0.2


def test_fixed_problem_sets_load_and_bad_files_are_named(tmp_path):
  good = tmp_path / "set.jsonl"
  rows = [{"target": 10, "nums": [2, 5]}, {"target": 24, "nums": [4, 6, 1]}]
  good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
  env = envs.make("countdown", problems=str(good))
  keys = jax.random.split(jax.random.key(0), 64)
  states, _ = jax.jit(jax.vmap(env.reset))(keys)
  seen = {(t, tuple(n)) for t, n in (problem(states, i) for i in range(64))}
  assert seen == {(10, (2, 5)), (24, (4, 6, 1))}
  missing = tmp_path / "nope.jsonl"
  with pytest.raises(ValueError, match=r"nope\.jsonl.*does not exist"):
    envs.make("countdown", problems=str(missing))
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"target": 1, "nums": [1]}\n{"target": 1, "nums": [1, 2\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: not JSON"):
    envs.make("countdown", problems=str(bad))
  bad.write_text('{"target": 3, "nums": [1, 2, 3, 4, 5]}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl, line 1: want"):
    envs.make("countdown", problems=str(bad))
  with pytest.raises(ValueError, match="min_numbers=5 exceeds"):
    envs.make("countdown", min_numbers=5)


def test_reset_and_step_compile_once():
  env = Countdown()
  keys = [jax.random.split(jax.random.key(k), 128) for k in (1, 2)]
  (s1, _), (s2, _) = assert_compiles_once(
    jax.vmap(env.reset), *[(k,) for k in keys]
  )
  data = jnp.zeros((128, 64), jnp.int32)
  answers = [
    core.Answer(data.at[:, 0].set(ord(str(d))), jnp.ones(128, jnp.int32))
    for d in (1, 2)
  ]
  (_, ts), _ = assert_compiles_once(
    jax.vmap(env.step), (s1, answers[0]), (s2, answers[1])
  )
  chex.assert_tree_all_finite(ts.reward)
