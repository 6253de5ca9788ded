"""FrozenLake's action ids, symbols and texts, in one place."""

# Action id -> name, in gym's order (LEFT=0, DOWN=1, RIGHT=2, UP=3), which
# RAGEN keeps; slipping turns to the neighbouring ids.
ACTIONS = ("Left", "Down", "Right", "Up")
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))

# Cell kinds of a rendered grid, in the order of ``SYMBOLS``.
PLAYER, EMPTY, HOLE, GOAL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
SYMBOLS = ("P", "_", "O", "G", "X", "√")
KIND_NAMES = (
  "player",
  "empty",
  "hole",
  "goal",
  "player in hole",
  "player on goal",
)

GOAL_REWARD = 1.0

INSTRUCTIONS = (
  "You are solving the FrozenLake puzzle. Avoid the holes and reach the "
  "goal. The ice may be slippery, so you can move in an unintended "
  "direction. Example answer format: <think>To avoid the hole and reach the "
  "goal, I should go left then up.</think><answer>Left || Up</answer>"
)

# RAGEN-2's (its CoordFrozenLake's): the answer's form without example
# reasoning, which a small model copies word for word.
INSTRUCTIONS_RAGEN2 = (
  "You are solving the FrozenLake puzzle. Avoid the holes and reach the "
  "goal. The ice may be slippery, so you can move in an unintended "
  "direction. Respond with a sequence of actions such as "
  "<answer>Left || Up || Up</answer>."
)
# Added where the observation lists coordinates.
COORDINATES = (
  " The observation gives zero-indexed (row, column) coordinates, from "
  "(0, 0) at the top left."
)
INSTRUCTION_SETS = ("ragen", "ragen2")
