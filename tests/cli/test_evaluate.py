"""``python -m starpo_jax.evaluate`` on a short-trained run: the summary
agrees with the episodes it wrote, and every transcript replays in the
plain-Python Sokoban: each turn's prompt shows the board the peer is in,
the reply parsed by the reference grammar gives the actions recorded as
executed, and the peer ends solved exactly when the episode succeeded."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sokoban
from reference import text as ref_text
from starpo_jax.agent import rollout
from starpo_jax.algo import step as step_lib
from starpo_jax.cli import evaluate as evaluate_cli
from starpo_jax.run import assembly, evaluator, train
from tests.envs.conftest import index, to_numpy
from tests.helpers import peer_of

LEVELS, SAMPLES = 24, 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  c = sokoban.get_config(None)
  c.sft.steps = 6
  c.sft.episodes = 32
  c.train.steps = 0
  c.train.eval_every = 0
  c.train.checkpoint_every = 3
  # A budget that ends episodes in the middle of a turn's answer: the
  # transcript must record only the actions executed.
  c.rollout.max_actions_per_traj = 2
  workdir = str(tmp_path_factory.mktemp("run"))
  train.run(c, workdir)
  return workdir


@pytest.fixture(scope="module")
def evaluated(run_dir):
  argv = [
    "evaluate",
    f"--workdir={run_dir}",
    f"--episodes={LEVELS}",
    f"--samples={SAMPLES}",
    "--temperatures=1.0,0",
    "--transcripts=3",
  ]
  summary = evaluate_cli.main(argv)
  return summary


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_summary_matches_the_episodes_written(evaluated):
  out = evaluated["out"]
  assert out.endswith(os.path.join("eval", "step6"))
  with open(os.path.join(out, "summary.json")) as f:
    written = json.load(f)
  assert written["envs"] == evaluated["envs"]
  # What was played, by name: the run's environment with its settings.
  assert written["settings"] == {"eval": {"env": "sokoban"}}
  entry = evaluated["envs"]["eval"]
  assert set(entry) == {"t1", "greedy", "random_valid"}
  for label in ("t1", "greedy"):
    records = read_jsonl(os.path.join(out, f"eval_{label}.jsonl"))
    assert len(records) == LEVELS * SAMPLES
    wins = np.array([r["success"] for r in records])
    stats = entry[label]
    assert stats["success"] == pytest.approx(wins.mean())
    assert stats["success_lo"] <= stats["success"] <= stats["success_hi"]
    solved_levels = wins.reshape(LEVELS, SAMPLES).any(axis=1)
    assert stats[f"pass@{SAMPLES}"] == pytest.approx(solved_levels.mean())
    actions = [sum(len(t["actions"]) for t in r["turns"]) for r in records]
    assert stats["num_actions"] == pytest.approx(np.mean(actions))
    turns = [t for r in records for t in r["turns"]]
    replies = stats["replies"]
    assert replies["turns"] == len(turns)
    tokens = np.mean([t["reply_tokens"] for t in turns])
    assert replies["reply_tokens"] == pytest.approx(tokens)
    # float32 sums on the device: equal to a few ulps.
    returns = np.mean([r["return"] for r in records])
    assert stats["return"] == pytest.approx(returns, rel=1e-5, abs=1e-6)
    turns = [t for r in records for t in r["turns"]]
    assert stats["num_turns"] == pytest.approx(len(turns) / len(records))
    for stat, flag in (
      ("valid_action_rate", "valid"),
      ("effective_action_rate", "effective"),
      ("format_rate", "format_ok"),
    ):
      assert stats[stat] == pytest.approx(np.mean([t[flag] for t in turns]))
    with open(os.path.join(out, f"eval_{label}.txt")) as f:
      assert f.read().count("[episode return") == 3
  # Greedy decoding plays both samples of a level the same way.
  greedy = read_jsonl(os.path.join(out, "eval_greedy.jsonl"))
  for a, b in zip(greedy[::2], greedy[1::2], strict=True):
    assert [t["reply"] for t in a["turns"]] == [t["reply"] for t in b["turns"]]


def test_transcripts_replay_in_the_plain_python_rules(run_dir, evaluated):
  config = assembly.load_config(run_dir)
  setup = assembly.build(config)
  cfg = dataclasses.replace(
    setup.config.rollout, env_groups=LEVELS, group_size=SAMPLES
  )
  key = rollout.reset_key(evaluator.held_out_key(config.seed))
  states = to_numpy(rollout.reset(setup.env, cfg, key))
  names = setup.env.spec.action_names
  records = read_jsonl(os.path.join(evaluated["out"], "eval_t1.jsonl"))
  acted = cut = 0
  for i, record in enumerate(records):
    peer = peer_of("sokoban", setup.env.jittable, index(states, i))
    used, done = 0, False
    for turn in record["turns"]:
      assert not done
      assert peer.text("grid") in turn["prompt"]
      matched, ids = ref_text.parse(
        (turn["prompt"] + turn["reply"]).encode(),
        think=False,
        markers=setup.codec.markers,
        max_actions=cfg.max_actions_per_turn,
        action_names=names,
      )
      assert matched == turn["format_ok"]
      executed = []
      for a in ids:
        if a < 0:
          continue
        if done or used >= cfg.max_actions_per_traj:
          cut += 1
          continue
        result = peer.step(a)
        executed.append(names[a])
        used += 1
        done = result.terminated or result.truncated
      assert executed == turn["actions"], (i, turn)
      acted += len(executed)
      done = done or used >= cfg.max_actions_per_traj
    assert record["success"] == peer.solved(), i
    assert record["num_actions"] == used
  # The warm start answers with actions, and some went past the budget.
  assert acted > 0 and cut > 0, (acted, cut)


def refused(capsys, argv, pattern):
  """``evaluate`` refuses ``argv``: exit status 2, one line matching
  ``pattern``."""
  with pytest.raises(SystemExit) as exit:
    evaluate_cli.main(argv)
  err = capsys.readouterr().err
  assert exit.value.code == 2, err
  assert len(err.strip().splitlines()) == 1, err
  assert re.search(pattern, err), err


def test_bad_requests_are_named(tmp_path, run_dir, capsys):
  refused(capsys, ["evaluate"], "--config alone")
  refused(
    capsys,
    ["evaluate", f"--workdir={run_dir}", f"--ckpt={run_dir}"],
    "not both",
  )
  refused(
    capsys,
    ["evaluate", f"--workdir={tmp_path}"],
    r"config\.json.*does not exist",
  )
  refused(capsys, ["evaluate", f"--ckpt={run_dir}"], "--ckpt needs --config")
  refused(
    capsys,
    ["evaluate", f"--workdir={run_dir}", "--step=4"],
    r"no checkpoint at step 4.*\[3, 6\]",
  )
  refused(
    capsys,
    ["evaluate", f"--workdir={run_dir}", "--temperatures=hot"],
    "not numbers",
  )
  refused(
    capsys,
    ["evaluate", f"--workdir={run_dir}", "--stpe=4"],
    "Unknown command line flag 'stpe'. Did you mean: step",
  )


def test_a_relative_workdir_is_read(run_dir, tmp_path, monkeypatch):
  # As a user types it: --workdir=runs/NAME from where the run was made.
  monkeypatch.chdir(os.path.dirname(run_dir))
  summary = evaluate_cli.main(
    [
      "evaluate",
      f"--workdir={os.path.basename(run_dir)}",
      "--episodes=4",
      "--temperatures=0",
      f"--out={tmp_path}",
    ]
  )
  assert summary["step"] > 0


def test_a_config_alone_evaluates_its_initial_policy(tmp_path, capsys):
  # A pretrained model zero-shot; here the tiny model's initial weights.
  summary = evaluate_cli.main(
    [
      "evaluate",
      "--config=configs/bandit.py",
      "--episodes=8",
      "--temperatures=1.0",
      f"--out={tmp_path}",
    ]
  )
  assert summary["step"] == 0
  assert summary["source"] == "the initial policy (tiny)"
  # It says what it does before the minutes it takes.
  first = capsys.readouterr().out.splitlines()[0]
  assert first.startswith("evaluating the initial policy (tiny), step 0: 8")
  for name, entry in summary["envs"].items():
    assert set(entry) == {"random_valid", "t1"}
    assert 0 <= entry["t1"]["format_rate"] <= 1
    assert len(read_jsonl(tmp_path / f"{name}_t1.jsonl")) == 8


def test_held_out_levels_are_no_training_steps_levels():
  """The README's claim: evaluation plays levels no training step draws,
  warm-start or RL, over the first 2,000 steps of a run."""
  seed, groups, held_out = 0, 16, 512

  def level_keys(reset_key, n):
    # What rollout.reset splits its key into: one key per group's level.
    k_levels, _ = jax.random.split(reset_key)
    return jax.random.key_data(jax.random.split(k_levels, n))

  def training(step):
    state = types.SimpleNamespace(key=jax.random.key(seed), step=step)
    rl = rollout.reset_key(step_lib.step_keys(state)[0])
    # The warm start's step plays the levels of fold_in(key, step) (sft.py).
    warm = rollout.reset_key(jax.random.fold_in(state.key, step))
    return jnp.concatenate([level_keys(rl, groups), level_keys(warm, groups)])

  trained = jax.vmap(training)(jnp.arange(2000)).reshape(-1, 2)
  evaluated = level_keys(
    rollout.reset_key(evaluator.held_out_key(seed)), held_out
  )
  seen = {tuple(k) for k in np.asarray(trained).tolist()}
  assert len(seen) == trained.shape[0]  # distinct among themselves too
  assert not seen & {tuple(k) for k in np.asarray(evaluated).tolist()}
