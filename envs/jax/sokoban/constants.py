"""Sokoban's action ids, cell symbols and reward constants, in one place."""

# Action id -> name. Pushing is moving into a box.
ACTIONS = ("Up", "Down", "Left", "Right")
# (row, col) change of each action, in the order of ``ACTIONS``.
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))

# Cell kinds a rendered grid distinguishes, in the order of the symbol tables.
WALL, EMPTY, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
KIND_NAMES = (
  "wall",
  "empty",
  "target",
  "box on target",
  "box",
  "player",
  "player on target",
)

# RAGEN's two symbol vocabularies (SimpleSokoban and
# SokobanDifferentGridVocab), in the order of the cell kinds above.
SYMBOLS = {
  "standard": ("#", "_", "O", "√", "X", "P", "S"),
  "alternate": ("W", ".", "G", "C", "B", "A", "@"),
}

# gym-sokoban's rewards, which RAGEN keeps.
STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0
# "shaped": all of the above; "outcome": SOLVED_REWARD alone.
REWARDS = ("shaped", "outcome")

INSTRUCTIONS = (
  "You are solving the Sokoban puzzle. You are the player and you need to "
  "push all boxes to targets. When you are right next to a box, you can push "
  "it by moving in the same direction. You cannot push a box through a wall, "
  "and you cannot pull a box. The answer should be a sequence of actions, "
  "like <answer>Right || Right || Up</answer>"
)
