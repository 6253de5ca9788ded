"""A TextArena single-player game, stepped on the host
(``envs/host/textarena.py``); by default TextArena's FrozenLake-v0 (4x4,
three holes, start top left, goal bottom right).

  python -m starpo_jax.main --config=configs/textarena.py
  python -m starpo_jax.main --config=configs/textarena.py:game=TowerOfHanoi-v0

Games with a fixed set of moves answer with one of their names (``ACTIONS``);
the others answer in free text, which goes to the game in brackets
(``[5]`` for GuessTheNumber). Other ``env.kwargs`` are the game's own
arguments. The first observation is the game's whole prompt, spelled byte by
byte by the tiny model's tokenizer: turns are long, so episodes are short.
No warm start: the planner plays inside the compiled step, on jittable
environments only.
"""

from configs import common

# Move names of the games whose moves are a fixed set.
ACTIONS = {
  "FrozenLake-v0": "up,down,left,right",
  "Sokoban-v0": "up,down,left,right",
}


def get_config(arg=None):
  args = common.parse_arg(arg, game="FrozenLake-v0")
  c = common.base_config()
  c.env.name = "textarena"
  c.env.kwargs = {
    "game": args["game"],
    "actions": ACTIONS.get(args["game"], ""),
    "max_obs_tokens": 1024,
  }
  common.apply_presets(c, args)
  c.sft.steps = 0
  c.rollout.max_turns = 3
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 6
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 3584
    c.train.steps = 50
    c.train.eval_every = 25
    c.train.eval_episodes = 64
    c.rollout.env_groups = 8
    c.rollout.group_size = 4
  return c
