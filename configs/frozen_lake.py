"""FrozenLake 4x4, deterministic (RAGEN's main FrozenLake setting), StarPO-S.

  python -m starpo_jax.main --config=configs/frozen_lake.py
  python -m starpo_jax.main \\
    --config=configs/frozen_lake.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B-Instruct

``instructions=ragen2``: RAGEN-2's system message (no example reasoning);
``render=grid_coord`` (or ``coord``): RAGEN's coordinate observations.
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, instructions="ragen", render="grid")
  c = common.base_config()
  c.env.name = "frozen_lake"
  c.env.kwargs.success_rate = 1.0
  if args["instructions"] != "ragen":
    c.env.kwargs.instructions = args["instructions"]
  if args["render"] != "grid":
    c.env.kwargs.render_mode = args["render"]
  common.apply_presets(c, args)
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 192
    # Warm start on the first turns of shortest safe paths, then StarPO-S
    # at a learning rate that keeps what the warm start taught.
    c.sft.steps = 150
    c.train.steps = 300
    c.train.eval_every = 50
    c.optim.lr = 1e-4
    # 16 levels of 8 episodes a step, so that the filter's quarter keeps 4
    # levels rather than 2 (docs/results.md, "Why these settings").
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
  elif args["model"] == "smollm2-135m":
    # Twice the warm start, half the copied reasoning of Bandit's: after
    # 12 steps of 32 tokens the model copied the board past its budget at
    # t=0.5 (docs/results.md, "A pretrained model that reasons").
    common.smollm2_on_cpu(
      c,
      turns=3,
      context=1024,
      expert="planner",
      rl_steps=24,
      warm_steps=24,
      reasoning_tokens=16,
    )
  return c
