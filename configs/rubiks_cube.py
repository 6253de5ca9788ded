"""A 2x2 Rubik's cube scrambled by 3 turns (RAGEN's), as Jumanji's
environment made a text environment.

  python -m starpo_jax.main --config=configs/rubiks_cube.py
  python -m starpo_jax.main --config=configs/rubiks_cube.py \\
    --config.env.name=rubiks_cube --config.rollout.max_context=1024  # 3x3

Turns U, U', U2 (and F, R, B, L, D likewise); reward 1 when solved.
"""

from configs import common


def get_config(arg=None):
  return common.jumanji_puzzle("rubiks_cube_2x2", arg, max_context=448)
