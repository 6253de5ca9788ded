"""RAGEN's own Sokoban, the gym-sokoban package, stepped on the host
(``envs/batch/host.py``): the Sokoban config's rollout, model and RL settings.

  python -m starpo_jax.evaluate --ckpt=runs/sokoban/checkpoints \\
    --config=configs/gym_sokoban.py:levels=sokoban
  python -m starpo_jax.main --config=configs/gym_sokoban.py \\
    --config.train.init_from=runs/sokoban

``levels=gym`` (the default) plays gym-sokoban's own levels, ``sokoban``
the jittable ``sokoban``'s for the same keys (the same held-out levels as
``configs/sokoban.py``). No warm start: the planner plays inside the
compiled step, on jittable environments only; start from a Sokoban run
(``train.init_from``), whose prompts are token for token these.
"""

from configs import common, sokoban


def get_config(arg=None):
  args = common.parse_arg(arg, levels="gym")
  levels = args.pop("levels")
  c = sokoban.get_config(",".join(f"{k}={v}" for k, v in args.items() if v))
  c.env.name = "gym_sokoban"
  c.env.kwargs = {"levels": levels}
  c.sft.steps = 0
  return c
