"""Evaluation across variants (``env.eval_variants``, RAGEN's validation
list): each variant is the environment its settings name, evaluated
beside ``eval`` with its own interval and random player, and a bad
variant is refused by name."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from configs import frozen_lake, sokoban
from starpo_jax.run import assembly, evaluator, presets


def test_ragens_sokoban_variants_are_the_rooms_they_name():
  setup = assembly.build(sokoban.get_config("variants=ragen"))
  assert set(setup.eval_envs) == {
    "eval",
    "sokoban_larger",
    "sokoban_vocab",
    "sokoban_two_boxes",
  }
  room = lambda tag: setup.eval_envs[tag].jittable
  # Independent of the presets table: RAGEN's names, read from the rooms.
  assert (room("eval").rows, room("eval").num_boxes) == (6, 1)
  larger = room("sokoban_larger")
  assert (larger.rows, larger.cols, larger.num_boxes) == (8, 8, 2)
  assert (
    room("sokoban_two_boxes").rows,
    room("sokoban_two_boxes").num_boxes,
  ) == (
    6,
    2,
  )
  # SokobanDifferentGridVocab: walls drawn W (RAGEN's alternate set), not #.
  assert "W" in room("sokoban_vocab").spec.pieces
  assert "#" not in room("sokoban_vocab").spec.pieces
  assert "#" in room("eval").spec.pieces
  # The variants add no token: a run trained without them (the default
  # command) is evaluated on them with its own tokenizer.
  plain = assembly.build(sokoban.get_config(None)).tokenizer
  assert setup.tokenizer.vocab_size == plain.vocab_size
  text = "W.GCBA@\n#_O√XPS <answer>Left</answer>"
  assert setup.tokenizer.encode(text) == plain.encode(text)
  # The run reads its presets back without a note: the variants survive
  # the config's JSON round trip (the workdir's config.json).
  c = sokoban.get_config("variants=ragen")
  again = assembly.parse(json.loads(json.dumps(c.to_dict())))
  assert (
    again.env.eval_variants
    == presets.EVAL_VARIANTS["sokoban_variants"]["env.eval_variants"]
  )
  assert not [n for n in presets.notes(again) if "eval_variants" in n]


def test_each_variant_is_evaluated_with_its_interval_and_random_player():
  c = frozen_lake.get_config("variants=ragen")
  c.rollout.max_turns = 2
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  ev = evaluator.make_evaluator(
    setup, learner, episodes=8, temperatures=(1.0,), transcripts=False
  )
  metrics, _ = ev(state.policy)
  tags = [
    "eval",
    "frozen_lake_6x6",
    "frozen_lake_slippery",
    "frozen_lake_steady",
  ]
  assert sorted(ev.envs) == tags
  for tag in tags:
    lo, p, hi = (
      metrics[f"{tag}/{k}"] for k in ("success_lo", "success", "success_hi")
    )
    assert 0 <= lo <= p <= hi <= 1
    assert 0 <= metrics[f"{tag}/random_success"] <= 1
  # The 6x6 board's prompts hold 6 rows of 6 cells.
  trajs = ev.trajectories(state.policy)
  prompt = setup.tokenizer.decode(
    trajs[("frozen_lake_6x6", 1.0)].tokens[0][
      ~trajs[("frozen_lake_6x6", 1.0)].loss_mask[0]
    ]
  )
  board = [r for r in prompt.split("\n") if r and set(r) <= set("P_OGX√")]
  assert len(board) >= 6 and [len(r) for r in board[:6]] == [6] * 6, prompt
  assert np.isfinite(metrics["frozen_lake_slippery/success"])


@pytest.mark.parametrize(
  ("variants", "message"),
  [
    ({"Larger": {"num_boxes": 2}}, "eval_variants.Larger: a tag is"),
    ({"eval": {"num_boxes": 2}}, "eval_variants.eval: a tag is"),
    ({"big": {"boxes": 2}}, "eval_variants.big: "),
    ({"big": {"env": "no_such_env"}}, "eval_variants.big: unknown environment"),
  ],
)
def test_a_bad_variant_is_refused_by_its_tag(variants, message):
  c = sokoban.get_config(None)
  c.env.eval_variants = variants
  with pytest.raises(assembly.ConfigError, match=message):
    assembly.build(c)


def test_variants_exist_only_where_ragen_has_them():
  with pytest.raises(ValueError, match="variants=ragen"):
    sokoban.get_config("variants=larger")
  from configs import bandit

  with pytest.raises(ValueError, match="exist for"):
    bandit.get_config("variants=ragen")


def test_evaluate_adds_ragens_variants_to_a_runs_config(tmp_path, capsys):
  from starpo_jax.cli import evaluate as evaluate_cli

  # A run's config.json, written as training writes it, has no variants.
  c = frozen_lake.get_config(None)
  run = assembly.parse(c)
  assert run.env.eval_variants == {}
  with open(tmp_path / "config.json", "w") as f:
    json.dump(c.to_dict(), f)
  saved = assembly.load_config(str(tmp_path))
  got = evaluate_cli._with_variants(saved, "ragen")
  assert sorted(got.env.eval_variants) == [
    "frozen_lake_6x6",
    "frozen_lake_slippery",
    "frozen_lake_steady",
  ]
  assert (
    got.env.eval_variants["frozen_lake_6x6"]
    == (
      presets.EVAL_VARIANTS["frozen_lake_variants"]["env.eval_variants"][
        "frozen_lake_6x6"
      ]
    )
  )
  assert evaluate_cli._with_variants(saved, None) is saved
  with pytest.raises(SystemExit) as exit:
    evaluate_cli.main(
      ["evaluate", "--config=configs/bandit.py", "--variants=ragen"]
    )
  err = capsys.readouterr().err
  assert exit.value.code == 2
  assert re.search(r"^evaluate: variants='ragen'.*exist for", err), err


def test_each_evaluation_names_its_environment_and_settings():
  from configs import mixture

  plain = assembly.build(frozen_lake.get_config("variants=ragen"))
  # Written out from RAGEN's variant list, not read from presets.
  assert plain.eval_settings == {
    "eval": {"env": "frozen_lake", "success_rate": 1.0},
    "frozen_lake_6x6": {"env": "frozen_lake", "success_rate": 1.0, "size": 6},
    "frozen_lake_slippery": {"env": "frozen_lake", "success_rate": 1 / 3},
    "frozen_lake_steady": {"env": "frozen_lake", "success_rate": 1.0},
  }
  mixed = assembly.build(mixture.get_config("variants=ragen"))
  assert set(mixed.eval_settings) == set(mixed.eval_envs)
  assert mixed.eval_settings["sokoban"] == {"env": "sokoban"}
  assert mixed.eval_settings["frozen_lake"] == plain.eval_settings["eval"]
  assert mixed.eval_settings["sokoban_larger"] == {
    "env": "sokoban",
    "dim_room": [8, 8],
    "num_boxes": 2,
  }
  # The environment each name evaluates is the one its settings build.
  assert mixed.eval_envs["frozen_lake_6x6"].jittable.size == 6
  assert mixed.eval_envs["sokoban_larger"].jittable.rows == 8


def _summary(settings: dict, success: dict, random: dict) -> dict:
  band = lambda p: dict(success=p, success_lo=p / 2, success_hi=(1 + p) / 2)
  return {
    "settings": settings,
    "envs": {
      tag: {"random_valid": band(random[tag]), "t0.5": band(p)}
      for tag, p in success.items()
    },
  }


def test_the_variants_table_puts_one_environment_on_one_row():
  from experiments import variants_table

  soko, fl = {"env": "sokoban"}, {"env": "frozen_lake", "success_rate": 1.0}
  larger = {"env": "sokoban", "num_boxes": 2}
  summaries = {
    "sokoban": _summary(
      {"eval": soko, "sokoban_larger": larger},
      {"eval": 0.6, "sokoban_larger": 0.1},
      {"eval": 0.2, "sokoban_larger": 0.02},
    ),
    "mixture": _summary(
      {"frozen_lake": fl, "sokoban": soko},
      {"frozen_lake": 0.7, "sokoban": 0.5},
      {"frozen_lake": 0.25, "sokoban": 0.2},
    ),
  }
  rows = variants_table.rows(summaries, "t0.5")
  success = lambda by: {n: s["success"] for n, s in by.items()}
  got = {r["env"]: (success(r["by"]), r["random"]["success"]) for r in rows}
  assert got == {
    "sokoban": ({"sokoban": 0.6, "mixture": 0.5}, 0.2),
    "sokoban_larger": ({"sokoban": 0.1}, 0.02),
    "frozen_lake": ({"mixture": 0.7}, 0.25),
  }
  text = variants_table.table(summaries)
  line = next(r for r in text.splitlines() if r.startswith("| frozen_lake "))
  assert line.split("|")[2:6] == [
    " success_rate=1 ",
    " - ",
    " 70.0% [35.0, 85.0] ",
    " 25.0% [12.5, 62.5] ",
  ]
  # Another set of levels (another random player) is refused, named.
  summaries["mixture"]["envs"]["sokoban"]["random_valid"]["success"] = 0.3
  with pytest.raises(ValueError, match="mixture played sokoban on other"):
    variants_table.rows(summaries, "t0.5")


@pytest.mark.parametrize("turns, budget", [(3, 6), (5, 10), (6, 10)])
def test_the_random_player_gets_the_agents_action_budget(
  monkeypatch, turns, budget
):
  # FrozenLake: 2 actions a turn, at most 10 an episode.
  c = frozen_lake.get_config(None)
  c.rollout.max_turns = turns
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  given = []

  def player(env, states, actions, key):
    given.append(actions)
    return states.steps >= 0

  monkeypatch.setattr(evaluator, "random_valid_success", player)
  evaluator.make_evaluator(
    setup, learner, episodes=4, temperatures=(1.0,), transcripts=False
  )
  assert given == [budget]


def _record(system, replies):
  """An ``episode_record`` of ``replies`` (text, executed actions), each
  after a prompt of its own."""
  turns = [
    {
      "turn": k + 1,
      "prompt": f"\nTurn {k + 1}: the board.\n<think>",
      "reply": text,
      "reply_tokens": len(text.split()),
      "actions": actions,
      "format_ok": True,
    }
    for k, (text, actions) in enumerate(replies)
  ]
  return {"system": system, "turns": turns}


def test_the_replies_summary_counts_a_planted_copy():
  system = (
    "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal."
  )
  answer = "</think><answer>Left || Down</answer>"
  eight = "puzzle. Avoid the holes and reach the goal."  # 8 words
  seven = "Avoid the holes and reach the goal."  # 7 words
  records = [
    _record(system, [(f"So, {eight}{answer}", ["Left", "Down"])]),
    _record(system, [(f"So, {seven} now{answer}", ["Left", "Down"])]),
    # A copy of the episode's own earlier turn counts as well.
    _record(
      system,
      [
        (f"I am at (1, 2) and go down twice.{answer}", ["Down"]),
        (f"Again: I am at (1, 2) and go down twice.{answer}", ["Down"]),
      ],
    ),
  ]
  got = evaluator.replies_summary(records)
  assert got["turns"] == 4
  assert got["copied"] == pytest.approx(2 / 4)
  assert got["distinct_reasoning"] == pytest.approx(4 / 4)
  assert got["actions"] == pytest.approx({"Down": 4 / 6, "Left": 2 / 6})
  # The same reasoning in two turns is one distinct string.
  twice = evaluator.replies_summary([records[0], records[0]])
  assert twice["distinct_reasoning"] == pytest.approx(1 / 2)
