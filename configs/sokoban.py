"""Sokoban 6x6 with one box (RAGEN's SimpleSokoban), StarPO-S.

  python -m starpo_jax.main --config=configs/sokoban.py
  python -m starpo_jax.main --config=configs/sokoban.py:algo=grpo
  python -m starpo_jax.main \\
    --config=configs/sokoban.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B-Instruct

The tiny model trains on a CPU: a supervised warm start, then StarPO-S
(the README's learning results give its time and success on 2 cores).
A 0.5B checkpoint wants an accelerator: 128 episodes of 5 turns and 100
tokens need about 2k tokens of context each.
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  c.env.name = "sokoban"
  common.apply_presets(c, args)
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] == "tiny":
    # Replies are a few action tokens: short budgets keep a step fast.
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 320
    # Warm start: 250 steps imitating the first turns of shortest solutions
    # (the planner's), then 200 StarPO-S steps, evaluated every 50.
    c.sft.steps = 250
    c.train.steps = 200
    c.train.eval_every = 50
    # RL's learning rate, smaller than the warm start's so that RL refines
    # what imitation taught (docs/results.md, "Why these settings").
    c.optim.lr = 1e-4
  elif args["model"] == "smollm2-135m":
    common.smollm2_on_cpu(
      c, turns=3, context=1024, expert="planner", rl_steps=12
    )
  return c
