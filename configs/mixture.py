"""Sokoban 6x6 and FrozenLake 4x4 in one run (RAGEN's es_manager with two
tags), StarPO-S: 4 groups of each a step, played in the one compiled
step, one update.

  python -m starpo_jax.main --config=configs/mixture.py
  python -m starpo_jax.main --config=configs/mixture.py:variants=ragen
  python -m starpo_jax.main --config=configs/mixture.py:parts=sokoban+sokoban

The tiny model with the default Sokoban run's recipe (configs/sokoban.py:
the same batch of 128 episodes, warm start and RL steps), so each
environment plays half the episodes its own run would. Each part is
evaluated by its tag (``sokoban/success``, ``frozen_lake/success``);
``eval/success`` pools them. ``parts`` names the environments, the 8
groups shared among them: ``sokoban+sokoban`` (tags ``sokoban`` and
``sokoban_2``) is the default Sokoban run played as a mixture, the
control that tells the mixture's machinery from two environments sharing
one small model (docs/results.md, "Mixtures").
"""

from configs import common, sokoban
from starpo_jax.run import presets

# Each environment a part may play, with its settings.
PARTS = {
  "sokoban": {"env": "sokoban"},
  "frozen_lake": {"env": "frozen_lake", "success_rate": 1.0},
}
GROUPS = 8


def get_config(arg=None):
  args = common.parse_arg(arg, parts="sokoban+frozen_lake")
  if args["model"] != "tiny":
    raise ValueError(
      f"configs/mixture.py: model={args['model']!r}: the mixture is tuned "
      "for the tiny model only (model=tiny)"
    )
  own = {k: v for k, v in args.items() if v and k not in ("variants", "parts")}
  c = sokoban.get_config(",".join(f"{k}={v}" for k, v in own.items()))
  c.env.mixture = _parts(args["parts"].split("+"))
  c.rollout.env_groups = GROUPS
  if args["variants"]:
    c.env.eval_variants = presets.mixture_variants(
      c.env.mixture.to_dict(), args["variants"]
    )
  return c


def _parts(names: list[str]) -> dict:
  """Each name's part, tagged by the name (``name_2``, ... for a repeat),
  the groups shared equally."""
  unknown = sorted(set(names) - set(PARTS))
  if unknown or GROUPS % len(names):
    raise ValueError(
      f"configs/mixture.py: parts={'+'.join(names)!r}: names from "
      f"{sorted(PARTS)}, joined by +, as many as divide {GROUPS} groups"
    )
  out = {}
  for i, name in enumerate(names):
    repeat = names[:i].count(name)
    tag = f"{name}_{repeat + 1}" if repeat else name
    out[tag] = {**PARTS[name], "groups": GROUPS // len(names)}
  return out
