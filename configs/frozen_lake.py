"""FrozenLake 4x4, deterministic (RAGEN's main FrozenLake setting), StarPO-S.

  python -m starpo_jax.main --config=configs/frozen_lake.py
  python -m starpo_jax.main \\
    --config=configs/frozen_lake.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B-Instruct
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  c.env.name = "frozen_lake"
  c.env.kwargs.success_rate = 1.0
  common.apply_preset(c, args["algo"])
  common.apply_model(c, args)
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 192
    c.train.steps = 90
  return c
