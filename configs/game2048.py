"""2048, as Jumanji's environment made a text environment.

  python -m starpo_jax.main --config=configs/game2048.py
  python -m starpo_jax.main --config=configs/game2048.py \\
    --config.env.kwargs.target_tile=256

Moves Up, Right, Down, Left; the reward is Jumanji's (the value of each
merged tile), success is reaching ``target_tile`` (2048 by default).
"""

from configs import common


def get_config(arg=None):
  return common.jumanji_puzzle("game2048", arg, max_context=384)
