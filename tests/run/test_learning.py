"""Learning on a short budget: the default FrozenLake recipe (warm start,
then StarPO-S) at a small size, measured on held-out levels."""

from __future__ import annotations

import re

import jax
import pytest

from configs import frozen_lake
from starpo_jax.run import assembly, checkpoint, train
from starpo_jax.run import metrics as metrics_lib

WARM, RL = 30, 3


def test_held_out_success_rises_over_a_short_warm_start_and_rl(tmp_path):
  c = frozen_lake.get_config(None)
  c.sft.steps, c.sft.episodes = WARM, 128
  c.train.steps = RL
  c.train.eval_every = WARM + RL  # untrained, after the warm start, final
  c.train.eval_episodes = 256
  c.train.eval_temperatures = (0.0,)
  c.train.checkpoint_every = 1000
  summary = train.run(c, str(tmp_path))
  records = {r["step"]: r for r in metrics_lib.read_metrics(str(tmp_path))}
  untrained, warm, final = records[0], records[WARM], records[WARM + RL]
  assert untrained["eval/success"] < 0.05
  assert untrained["eval/valid_action_rate"] < 0.2
  # The policy answers validly and solves clearly more held-out levels.
  for after in (warm, final):
    assert after["eval/valid_action_rate"] > 0.9
    assert after["eval/success"] > untrained["eval/success"] + 0.1
  assert summary["eval_success"][WARM + RL] == final["eval/success"]
  # Each evaluation writes a held-out episode as the model saw it, its
  # turns' rewards adding up to the episode's return.
  for step in (0, WARM, WARM + RL):
    text = (
      tmp_path / "transcripts" / f"step{step:06d}_eval_t0.txt"
    ).read_text()
    assert text.startswith("<|im_start|>system\n")
    turns = [float(r) for r in re.findall(r"; reward ([-+]\d+\.\d\d)\]", text)]
    end = re.fullmatch(
      r".*\[episode return ([-+]\d+\.\d\d), (no success|success)\]",
      text,
      re.DOTALL,
    )
    assert turns and end, text[-300:]
    assert sum(turns) == pytest.approx(float(end[1]), abs=0.006 * len(turns))
  # Warm-start steps log the imitation loss, RL steps the rollout.
  assert "sft/loss" in records[WARM] and "rollout/success" not in records[WARM]
  assert "rollout/success" in final and "sft/loss" not in final
  # The boundary is checkpointed, with the optimizer's step count reset.
  setup = assembly.build(c)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), 3)
  assert WARM in ckpt.manager.all_steps()
  restored = ckpt.restore(
    WARM, assembly.init_state(setup, assembly.make_learner(setup))
  )
  ckpt.close()
  counts = [
    int(x)
    for path, x in jax.tree_util.tree_leaves_with_path(restored.policy_opt)
    if "count" in jax.tree_util.keystr(path)
  ]
  assert counts and not any(counts)
