"""Sokoban 6x6 and FrozenLake 4x4 in one run (RAGEN's es_manager with two
tags), StarPO-S: 4 groups of each a step, played in the one compiled
step, one update.

  python -m starpo_jax.main --config=configs/mixture.py
  python -m starpo_jax.main --config=configs/mixture.py:variants=ragen

The tiny model with the default Sokoban run's recipe (configs/sokoban.py:
the same batch of 128 episodes, warm start and RL steps), so each
environment plays half the episodes its own run would. Each part is
evaluated by its tag (``sokoban/success``, ``frozen_lake/success``);
``eval/success`` pools them.
"""

from configs import common, sokoban
from starpo_jax.run import presets


def get_config(arg=None):
  args = common.parse_arg(arg)
  if args["model"] != "tiny":
    raise ValueError(
      f"configs/mixture.py: model={args['model']!r}: the mixture is tuned "
      "for the tiny model only (model=tiny)"
    )
  own = {k: v for k, v in args.items() if v and k != "variants"}
  c = sokoban.get_config(",".join(f"{k}={v}" for k, v in own.items()))
  c.env.mixture = {
    "sokoban": {"env": "sokoban", "groups": 4},
    "frozen_lake": {"env": "frozen_lake", "groups": 4, "success_rate": 1.0},
  }
  c.rollout.env_groups = 8
  if args["variants"]:
    c.env.eval_variants = presets.mixture_variants(
      c.env.mixture.to_dict(), args["variants"]
    )
  return c
