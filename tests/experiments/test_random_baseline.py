"""The random-policy baseline against a plain-Python count of the same
episodes."""

from __future__ import annotations

import envs
from experiments import random_baseline


def test_more_actions_never_solve_fewer_levels():
  env = envs.make("frozen_lake", success_rate=1.0)
  rates = [random_baseline.success_rate(env, 256, n) for n in (0, 1, 10, 40)]
  assert rates[0] == 0.0
  assert rates == sorted(rates)
  assert 0.0 < rates[2] < rates[3] <= 1.0


def test_a_board_without_holes_is_solved_by_a_long_random_walk():
  # p=1: every tile frozen, so a random walk reaches the goal eventually.
  env = envs.make("frozen_lake", success_rate=1.0, p=1.0, max_steps=400)
  assert random_baseline.success_rate(env, 128, 400) > 0.95


def test_the_random_player_only_picks_available_actions():
  # The bandit offers two of its 40 arm names: a random valid pull takes
  # the risky one half the time (a draw over all 40 names would rarely
  # pull an offered arm at all).
  rate = random_baseline.success_rate(envs.make("bandit"), 2048, 1)
  assert 0.45 < rate < 0.55
