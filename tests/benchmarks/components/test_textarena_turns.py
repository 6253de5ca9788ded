"""``python -m benchmarks.components.textarena_turns`` at smoke size: the
three ways play the same episode-turns, and the row says what each cost."""

from __future__ import annotations

import json

import textarena

from benchmarks.components import textarena_turns


def test_smoke_run_times_the_three_ways_on_the_same_turns(tmp_path):
  out = tmp_path / "turns.json"
  textarena_turns.main(
    ["--batch", "3", "--turns", "4", "--repeats", "1", "--json", str(out)]
  )
  row = json.loads(out.read_text())["row"]
  assert set(row["us_per_turn"]) == {"plain", "wrapper", "bridge"}
  assert all(v > 0 for v in row["us_per_turn"].values())
  # Turns counted by TextArena itself: each episode until it ends.
  moves = textarena_turns.plan(3, 4)
  n = 0
  for seed, ids in enumerate(moves):
    env = textarena.make("FrozenLake-v0-raw")
    env.reset(num_players=1, seed=seed)
    for m in ids:
      n += 1
      if env.step(action=f"[{textarena_turns.MOVES[m]}]")[0]:
        break
  assert row["episode_turns"] == n
