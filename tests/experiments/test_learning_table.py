"""The README's learning table and curves, from hand-written run records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import learning_table, plot_curves, zero_shot_table


def _eval(step, success, elapsed):
  out = {"step": step, "time/elapsed_s": elapsed}
  for at in ("", "@t0"):
    out[f"eval/success{at}"] = success
    out[f"eval/success_lo{at}"] = success - 0.04
    out[f"eval/success_hi{at}"] = success + 0.04
  out |= {
    "eval/random_success": 0.2,
    "eval/random_success_lo": 0.17,
    "eval/random_success_hi": 0.23,
  }
  return out


def _rl(step, success, elapsed):
  return {
    "step": step,
    "time/elapsed_s": elapsed,
    "rollout/success": success,
    "rollout/valid_action_rate": 1.0,
    "rollout/entropy": 0.5,
  }


@pytest.fixture
def resumed_run(tmp_path):
  """Two warm-start steps, then RL; the process restarted after step 3."""
  records = [
    _eval(0, 0.0, 10.0),
    {"step": 1, "sft/loss": 2.0, "time/elapsed_s": 20.0},
    {**_eval(2, 0.4, 30.0), "sft/loss": 1.0},
    _rl(3, 0.3, 40.0),
    _rl(4, 0.5, 15.0),  # a new process: its clock starts again
    {**_rl(5, 0.7, 25.0), **_eval(5, 0.6, 25.0)},
  ]
  (tmp_path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in records)
  )
  return tmp_path


def test_the_table_counts_rl_from_the_warm_start_and_sums_processes(
  resumed_run,
):
  s = learning_table.summarize(str(resumed_run))
  assert (s["warm_start_steps"], s["rl_steps"]) == (2, 3)
  assert s["gain"] == pytest.approx(0.2)  # 0.6 final - 0.4 where RL began
  assert s["minutes"] == pytest.approx((40.0 + 25.0) / 60)
  assert s["processes"] == 2
  assert s["train_success"] == pytest.approx((0.5, 0.5))
  text = learning_table.table([s])
  assert "| final (t=0.5) | 60.0% [56.0, 64.0] |" in text
  assert "+20.0 / +20.0 points" in text
  assert "1.1 min (2 processes)" in text


def test_the_curves_render(resumed_run, tmp_path):
  out = tmp_path / "curves.png"
  plot_curves.main([str(resumed_run), "--out", str(out)])
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_thinking_run_without_greedy_evaluations(tmp_path):
  # A pretrained model's run: held-out evaluations at t=0.5 only, with
  # the format rate and reasoning tokens a turn.
  def ev(step, success, fmt, think):
    out = {k: v for k, v in _eval(step, success, 1.0).items() if "@t0" not in k}
    return out | {"eval/format_rate": fmt, "eval/think_tokens": think}

  records = [
    ev(0, 0.0, 0.05, 9.0),
    {**ev(1, 0.3, 0.7, 12.4), "sft/loss": 1.0},
    {**_rl(2, 0.4, 2.0), **ev(2, 0.5, 0.95, 8.25)},
  ]
  (tmp_path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in records)
  )
  text = learning_table.table([learning_table.summarize(str(tmp_path))])
  assert "| final, greedy | - |" in text
  assert "+20.0 / - points" in text
  assert "| 5.0% / 70.0% / 95.0% |" in text
  assert "| 9.0 / 12.4 / 8.2 |" in text


def test_a_run_without_evaluations_reports_its_training_rollouts(tmp_path):
  # The StarPO comparison run: no held-out evaluation, its reasoning read
  # from the training rollouts (first and last ten RL steps) and the
  # collapse diagnostics where they ran.
  rl = lambda step, fmt, think: (
    _rl(step, 0.5, float(step))
    | {
      "rollout/format_rate": fmt,
      "rollout/think_tokens": think,
    }
  )
  records = [{"step": 1, "sft/loss": 1.0, "time/elapsed_s": 1.0}]
  records += [rl(k, 0.5 if k < 12 else 1.0, 20.0 - k) for k in range(2, 24)]
  records[10] |= {"collapse/mi": 0.5}
  records[20] |= {"collapse/mi": 0.85}
  (tmp_path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in records)
  )
  s = learning_table.summarize(str(tmp_path))
  assert (s["warm_start_steps"], s["rl_steps"]) == (1, 22)
  text = learning_table.table([s])
  assert "| final (t=0.5) | - |" in text
  assert "| - / - points |" in text
  assert "| 50.0% / 100.0% |" in text  # steps 2-11, then 14-23
  assert "| 13.5 / 1.5 |" in text
  assert "| 0.50 (11), 0.85 (21) |" in text


def test_the_json_names_the_machine_and_commit(resumed_run, tmp_path):
  out = tmp_path / "learn.json"
  learning_table.main([str(resumed_run), "--json", str(out)])
  payload = json.loads(out.read_text())
  assert payload["machine"]["cores"] >= 1
  assert len(payload["commit"].split("+")[0]) == 40
  assert payload["runs"][0]["rl_steps"] == 3


def _summary(success, fmt, valid, think, rand):
  band = lambda x: {"success": x, "success_lo": x / 2, "success_hi": x * 2}
  played = band(success) | {
    "format_rate": fmt,
    "valid_action_rate": valid,
    "think_tokens": think,
  }
  return {"envs": {"eval": {"random_valid": band(rand), "t0.5": played}}}


def test_zero_shot_table_reads_each_evaluations_summary(tmp_path, capsys):
  for name, s in (
    ("bandit", _summary(0.1, 0.5, 0.25, 9.0, 0.4)),
    ("sokoban", _summary(0.02, 0.2, 0.0, 7.25, 0.2)),
  ):
    (tmp_path / name).mkdir()
    (tmp_path / name / "summary.json").write_text(json.dumps(s))
  out = tmp_path / "zero.json"
  zero_shot_table.main(
    [str(tmp_path / "bandit"), str(tmp_path / "sokoban"), f"--json={out}"]
  )
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == "|  | bandit | sokoban |"
  assert lines[2] == (
    "| success | 10.0% [5.0, 20.0] (t0.5) | 2.0% [1.0, 4.0] (t0.5) |"
  )
  assert lines[3] == (
    "| in the format / valid actions / reasoning tokens "
    "| 50.0% / 25.0% / 9.0 | 20.0% / 0.0% / 7.2 |"
  )
  assert lines[4] == (
    "| random valid player, same levels "
    "| 40.0% [20.0, 80.0] | 20.0% [10.0, 40.0] |"
  )
  written = json.loads(out.read_text())
  assert written["sokoban"]["envs"]["eval"]["t0.5"]["think_tokens"] == 7.25
  assert {"machine", "commit"} <= set(written)
  with pytest.raises(SystemExit, match=r"nowhere/summary\.json is missing"):
    zero_shot_table.main([str(tmp_path / "nowhere")])


def test_the_brief_table_keeps_its_rows_only(resumed_run):
  full = learning_table.table([learning_table.summarize(resumed_run)])
  brief = learning_table.table(
    [learning_table.summarize(resumed_run)], brief=True
  )
  labels = [line.split(" | ")[0][2:] for line in brief.splitlines()[2:]]
  assert labels == list(learning_table.BRIEF)
  assert set(brief.splitlines()) <= set(full.splitlines())


def _run(path, config, records):
  path.mkdir()
  (path / "config.json").write_text(json.dumps(config))
  (path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in records)
  )
  return str(path)


def _held_out(name, step, success):
  out = {"step": step}
  for suffix, value in (("", success), ("_lo", success - 0.05)):
    out[f"{name}/success{suffix}"] = value
  out[f"{name}/success_hi"] = success + 0.05
  return out


def test_the_mixture_table_matches_a_part_to_its_run_by_own_episodes(tmp_path):
  from experiments import mixture_table

  rollout = {"group_size": 16, "env_groups": 8}
  mixed = _run(
    tmp_path / "mixture",
    {
      "env": {"mixture": {"sokoban": {"env": "sokoban", "groups": 4}}},
      "rollout": rollout,
      "sft": {"steps": 10},
    },
    [
      {
        **_held_out("sokoban", 10, 0.3),
        "sokoban/random_success": 0.2,
        "sokoban/random_success_lo": 0.1,
        "sokoban/random_success_hi": 0.3,
      },
      _held_out("sokoban", 30, 0.5),
      {"step": 11, "filter/sokoban/kept_ratio": 0.5},
      {"step": 12, "filter/sokoban/kept_ratio": 0.0},
      {"step": 12, "rollout/sokoban/in_group_reward_std": 2.0},
    ],
  )
  # The own run: 8 x 16 = 128 episodes a step after 5 warm-start steps,
  # so the mixture's 20 x 64 = 1280 are its step 5 + 10.
  own = _run(
    tmp_path / "own",
    {"rollout": rollout, "sft": {"steps": 5}},
    [_held_out("eval", s, p) for s, p in ((5, 0.2), (15, 0.45), (25, 0.6))],
  )
  p = mixture_table.part(mixed, "sokoban", own)
  assert (p["episodes"], p["own_step"]) == (1280, 15)
  assert p["own_matched"]["success"] == 0.45
  assert p["own_final"]["success"] == 0.6
  assert p["final"]["success"] == 0.5 and p["start"]["success"] == 0.3
  assert (p["kept"], p["spread"]) == (0.25, 2.0)
  assert "+5.0 points" in mixture_table.table([p])
  # Not evaluated at the matching step: refused, naming the steps it has.
  (tmp_path / "own" / "metrics.jsonl").write_text(
    json.dumps(_held_out("eval", 5, 0.2)) + "\n"
  )
  with pytest.raises(ValueError, match=r"evaluated at \[5\]"):
    mixture_table.part(mixed, "sokoban", own)


def _seeded_part(run, tag, final, matched, own_final, start=0.3):
  return {
    "mixture": run,
    "tag": tag,
    "start": {"success": start},
    "own_start": {"success": 0.35},
    "final": {"success": final},
    "own_matched": {"success": matched},
    "own_final": {"success": own_final},
  }


def test_the_seeds_table_gathers_a_setting_over_its_seeds():
  from experiments import mixture_seeds

  # Differences -0.20, +0.15, +0.12 at seeds 0, 1, 3: by hand, mean
  # 0.07 / 3, and Student's t(0.975, 2 df) = 4.3027 from a table.
  tables = [
    {"parts": [_seeded_part("runs/mixture_by_part", "sokoban", 0.4, 0.6, 0.7)]},
    {
      "parts": [
        _seeded_part("runs/mixture_by_part_seed1", "sokoban", 0.65, 0.5, 0.6),
        _seeded_part("runs/mixture_seed1", "sokoban", 0.5, 0.5, 0.6),
      ]
    },
    {
      "parts": [
        _seeded_part(
          "/tmp/mixture_by_part_seed3/", "sokoban", 0.42, 0.3, 0.4, start=0.2
        )
      ]
    },
  ]
  by_part, together = mixture_seeds.rows(tables, limit=0.1)
  assert (by_part["setting"], by_part["seeds"]) == (
    "mixture_by_part",
    [0, 1, 3],
  )
  np.testing.assert_allclose(by_part["differences"], [-0.2, 0.15, 0.12])
  mean = 0.07 / 3
  sd = np.sqrt(
    ((-0.2 - mean) ** 2 + (0.15 - mean) ** 2 + (0.12 - mean) ** 2) / 2
  )
  half = 4.3027 * sd / np.sqrt(3)
  np.testing.assert_allclose(
    [by_part["mean"], by_part["sd"], by_part["lo"], by_part["hi"]],
    [mean, sd, mean - half, mean + half],
    atol=1e-4,
  )
  # Within 10 points: none; no more than 10 below: +0.15 and +0.12.
  assert by_part["within"] == 0 and by_part["not_below"] == 2
  assert by_part["own_final"] == [0.7, 0.6, 0.4]
  # After the warm starts: -0.05, -0.05, -0.15 (mean -0.0833).
  np.testing.assert_allclose(
    by_part["start_differences"], [-0.05, -0.05, -0.15]
  )
  assert (together["setting"], together["seeds"]) == ("mixture", [1])
  text = mixture_seeds.table([by_part, together], 0.1)
  assert "-20.0, +15.0, +12.0" in text and "| 0 of 3 | 2 of 3 | -8.3 |" in text
  # A setting's part twice at one seed is refused.
  with pytest.raises(ValueError, match="sokoban twice at seed 1"):
    mixture_seeds.rows([tables[1], tables[1]], limit=0.1)
