"""Sokoban 6x6 and FrozenLake 4x4 in one run (RAGEN's es_manager with two
tags), StarPO-S: 4 groups of each a step, played in the one compiled
step, one update.

  python -m starpo_jax.main --config=configs/mixture.py
  python -m starpo_jax.main --config=configs/mixture.py:variants=ragen

The tiny model as the default Sokoban run has it: the same batch (128
episodes), warm start and RL steps, so each environment plays half the
episodes its own run would. Each part is evaluated by its tag
(``sokoban/success``, ``frozen_lake/success``); ``eval/success`` pools
them.
"""

from configs import common
from starpo_jax.run import presets


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  common.apply_presets(c, {**args, "variants": ""})
  c.env.mixture = {
    "sokoban": {"env": "sokoban", "groups": 4},
    "frozen_lake": {"env": "frozen_lake", "groups": 4, "success_rate": 1.0},
  }
  c.rollout.env_groups = 8
  if args["variants"]:
    c.env.eval_variants = presets.mixture_variants(
      c.env.mixture.to_dict(), args["variants"]
    )
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] != "tiny":
    raise ValueError(
      f"configs/mixture.py: model={args['model']!r}: the mixture is tuned "
      "for the tiny model only (model=tiny)"
    )
  # As configs/sokoban.py's tiny run: short replies, a warm start on the
  # planners' shortest solutions (both environments have one), then RL.
  c.rollout.max_new_tokens = 8
  c.rollout.max_context = 320
  c.sft.steps = 250
  c.train.steps = 200
  c.train.eval_every = 50
  c.optim.lr = 1e-4
  return c
