"""Any gymnasium environment that speaks text, stepped on the host
(``envs/host/gymnasium_text.py``); by default gymnasium's own FrozenLake-v1
(4x4, not slippery), as its ANSI text.

  python -m starpo_jax.main --config=configs/gymnasium.py
  python -m starpo_jax.main --config=configs/gymnasium.py \\
    --config.env.kwargs.id=Taxi-v3 \\
    --config.env.kwargs.actions=South,North,East,West,Pickup,Dropoff

Other ``env.kwargs`` go to ``gymnasium.make``. FrozenLake-v1's map does
not change with the seed: every episode, held-out ones included, is the
same level (``configs/frozen_lake.py`` draws a new one each episode). No
warm start: the planner plays inside the compiled step, on jittable
environments only.
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  c.env.name = "gymnasium"
  c.env.kwargs = {
    "id": "FrozenLake-v1",
    "actions": "Left,Down,Right,Up",
    "render_mode": "ansi",
    "is_slippery": False,
    "max_obs_tokens": 64,
  }
  common.apply_presets(c, args)
  c.sft.steps = 0
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] == "tiny":
    # The ANSI board is about 40 tokens spelled byte by byte.
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 512
    c.train.steps = 100
    c.train.eval_every = 50
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
  return c
