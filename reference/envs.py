"""Plain-Python implementations of the environments' rules.

Written from RAGEN's and gym's rules, sharing no code with the JAX
environments, so that stepping both side by side tests one against the
other. The Sokoban benchmark also times them as the Python peer.
"""

from __future__ import annotations

import dataclasses

SOKOBAN_SYMBOLS = {
  "standard": dict(
    wall="#",
    empty="_",
    target="O",
    box_on_target="√",
    box="X",
    player="P",
    player_on_target="S",
  ),
  "alternate": dict(
    wall="W",
    empty=".",
    target="G",
    box_on_target="C",
    box="B",
    player="A",
    player_on_target="@",
  ),
}
SOKOBAN_MOVES = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}


def _coords(cells) -> str:
  return ", ".join(f"({r}, {c})" for r, c in sorted(cells))


def _coord_text(rows, cols, labelled) -> str:
  lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
  for label, cells in labelled:
    if cells:
      lines.append(f"{label}: {_coords(cells)}")
  return "\n".join(lines)


def _board_text(mode: str, coord_text, grid_text) -> str:
  if mode == "grid":
    return grid_text()
  if mode == "coord":
    return coord_text()
  return "Coordinates: \n" + coord_text() + "\nGrid Map: \n" + grid_text()


@dataclasses.dataclass
class StepResult:
  reward: float
  terminated: bool
  truncated: bool
  success: bool
  valid: bool
  effective: bool


@dataclasses.dataclass
class Sokoban:
  walls: set
  targets: set
  boxes: set
  player: tuple
  rows: int
  cols: int
  max_steps: int
  symbols: str = "standard"
  steps: int = 0

  def solved(self) -> bool:
    return self.boxes <= self.targets

  def done(self) -> bool:
    return self.solved() or self.steps >= self.max_steps

  def step(self, action: int) -> StepResult:
    valid = action in SOKOBAN_MOVES
    if not valid or self.done():
      return self._result(0.0, valid, False)
    dr, dc = SOKOBAN_MOVES[action]
    r, c = self.player
    dest = (r + dr, c + dc)
    beyond = (r + 2 * dr, c + 2 * dc)
    on_before = len(self.boxes & self.targets)
    moved = False
    if dest not in self.walls:
      if dest in self.boxes:
        if beyond not in self.walls and beyond not in self.boxes:
          self.boxes = (self.boxes - {dest}) | {beyond}
          self.player = dest
          moved = True
      else:
        self.player = dest
        moved = True
    self.steps += 1
    on_after = len(self.boxes & self.targets)
    reward = -0.1
    if on_after > on_before:
      reward += 1.0
    if on_after < on_before:
      reward -= 1.0
    if self.solved():
      reward += 10.0
    return self._result(reward, True, moved)

  def _result(self, reward, valid, effective) -> StepResult:
    solved = self.solved()
    return StepResult(
      reward=reward,
      terminated=solved,
      truncated=self.steps >= self.max_steps and not solved,
      success=solved,
      valid=valid,
      effective=effective,
    )

  def grid_text(self) -> str:
    sym = SOKOBAN_SYMBOLS[self.symbols]
    lines = []
    for r in range(self.rows):
      row = ""
      for c in range(self.cols):
        cell = (r, c)
        if cell in self.walls:
          row += sym["wall"]
        elif cell in self.boxes:
          row += sym["box_on_target" if cell in self.targets else "box"]
        elif cell == self.player:
          row += sym["player_on_target" if cell in self.targets else "player"]
        elif cell in self.targets:
          row += sym["target"]
        else:
          row += sym["empty"]
      lines.append(row)
    return "\n".join(lines)

  def coord_text(self) -> str:
    player = {self.player}
    return _coord_text(
      self.rows,
      self.cols,
      [
        ("Walls", self.walls),
        ("Targets", self.targets),
        ("Boxes", self.boxes - self.targets),
        ("Boxes on target", self.boxes & self.targets),
        ("Player", player - self.targets),
        ("Player on target", player & self.targets),
      ],
    )

  def text(self, mode: str) -> str:
    return _board_text(mode, self.coord_text, self.grid_text)


def play_answer(
  env, actions: list[int], used: int, max_actions: int, format_penalty: float
) -> tuple[float, bool, bool, int]:
  """RAGEN's turn: an answer's actions (ids, -1 for a part naming none)
  stepped in order while the episode lasts and actions remain; the format
  penalty when no action, or not every part, was valid. Returns (reward,
  whether no action was valid, whether the environment ended, actions
  used so far)."""
  reward, valid, env_done = 0.0, 0, False
  for a in actions:
    if a < 0 or env_done or used >= max_actions:
      continue
    result = env.step(a)
    used += 1
    valid += 1
    reward += result.reward
    env_done = result.terminated or result.truncated
  if valid == 0 or valid < len(actions):
    reward += format_penalty
  return reward, valid == 0, env_done, used


FROZEN_LAKE_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}


@dataclasses.dataclass
class FrozenLake:
  holes: set
  start: tuple
  goal: tuple
  size: int
  max_steps: int
  player: tuple = None
  steps: int = 0

  def __post_init__(self):
    if self.player is None:
      self.player = self.start

  def terminal(self) -> bool:
    return self.player == self.goal or self.player in self.holes

  def step(self, action: int, direction: int | None = None) -> StepResult:
    """``direction`` is where the ice took the player (default: as asked)."""
    valid = action in FROZEN_LAKE_MOVES
    if not valid or self.terminal() or self.steps >= self.max_steps:
      return self._result(0.0, valid, False)
    dr, dc = FROZEN_LAKE_MOVES[action if direction is None else direction]
    r = min(max(self.player[0] + dr, 0), self.size - 1)
    c = min(max(self.player[1] + dc, 0), self.size - 1)
    moved = (r, c) != self.player
    self.player = (r, c)
    self.steps += 1
    return self._result(1.0 if self.player == self.goal else 0.0, True, moved)

  def _result(self, reward, valid, effective) -> StepResult:
    terminal = self.terminal()
    return StepResult(
      reward=reward,
      terminated=terminal,
      truncated=self.steps >= self.max_steps and not terminal,
      success=self.player == self.goal,
      valid=valid,
      effective=effective,
    )

  def grid_text(self) -> str:
    lines = []
    for r in range(self.size):
      row = ""
      for c in range(self.size):
        cell = (r, c)
        if cell == self.player:
          row += (
            "X" if cell in self.holes else "√" if cell == self.goal else "P"
          )
        elif cell in self.holes:
          row += "O"
        elif cell == self.goal:
          row += "G"
        else:
          row += "_"
      lines.append(row)
    return "\n".join(lines)

  def coord_text(self) -> str:
    p = self.player
    return _coord_text(
      self.size,
      self.size,
      [
        ("Start", {self.start}),
        ("Goal", {self.goal}),
        ("Player", {p} if p != self.goal and p not in self.holes else set()),
        ("Player on goal", {p} if p == self.goal else set()),
        ("Player in hole", {p} if p in self.holes else set()),
        ("Holes", self.holes),
      ],
    )

  def text(self, mode: str) -> str:
    return _board_text(mode, self.coord_text, self.grid_text)


def frozen_lake_solvable(holes: set, start: tuple, goal: tuple, size) -> bool:
  """Depth-first search from the start to the goal around the holes."""
  seen, frontier = {start}, [start]
  while frontier:
    r, c = frontier.pop()
    if (r, c) == goal:
      return True
    for dr, dc in FROZEN_LAKE_MOVES.values():
      nxt = (r + dr, c + dc)
      if (
        0 <= nxt[0] < size
        and 0 <= nxt[1] < size
        and nxt not in holes
        and nxt not in seen
      ):
        seen.add(nxt)
        frontier.append(nxt)
  return False


BANDIT_PROMPT = (
  "You are playing a bandit game. Goal: Maximize your total reward by "
  "choosing which arm to pull.\nGame Rules:\n1. There are 2 arms, named "
  "{a} and {b}\n2. Each arm has its own reward distribution, related to "
  "their names.\n3. Analyze the symbolic meaning of each arm's name to "
  "guess how their reward distribution might behave.\n4. Based on the "
  "symbolic meaning of their names, which arm do you think is more likely "
  "to give higher rewards on average? Choose between {a} and {b}, and "
  "output like <answer> {a} </answer> or <answer> {b} </answer>.\n"
)


@dataclasses.dataclass
class Bandit:
  low: str
  high: str
  high_first: bool
  pulled: str | None = None
  reward: float | None = None

  def step(self, name: str, high_wins: bool) -> StepResult:
    valid = name in (self.low, self.high)
    if not valid or self.pulled is not None:
      return self._result(0.0, valid, False)
    self.pulled = name
    if name == self.low:
      self.reward = 0.1
    else:
      self.reward = 1.0 if high_wins else 0.0
    return self._result(self.reward, True, True)

  def _result(self, reward, valid, effective) -> StepResult:
    return StepResult(
      reward=reward,
      terminated=self.pulled is not None,
      truncated=False,
      success=self.pulled == self.high,
      valid=valid,
      effective=effective,
    )

  def text(self) -> str:
    if self.pulled is not None:
      return f"{self.pulled}: {self.reward} points"
    a, b = (self.high, self.low) if self.high_first else (self.low, self.high)
    return BANDIT_PROMPT.format(a=a, b=b)


def frozen_lake_generate(rng, size: int, p: float) -> FrozenLake:
  """RAGEN's map rule in plain Python: redraw until the goal is reachable."""
  while True:
    holes = {
      (r, c) for r in range(size) for c in range(size) if rng.random() >= p
    }
    start = (rng.randrange(size), rng.randrange(size))
    goal = (rng.randrange(size), rng.randrange(size))
    if start == goal:
      continue
    holes -= {start, goal}
    if frozen_lake_solvable(holes, start, goal, size):
      return FrozenLake(holes, start, goal, size, max_steps=100)


def bandit_generate(rng, pairs) -> Bandit:
  low, high = rng.choice(pairs)
  return Bandit(low, high, high_first=rng.random() < 0.5)


@dataclasses.dataclass
class Sudoku:
  """A Sudoku of ``box * box`` rows: ``grid[r][c]`` is 0 (empty) or a digit.
  A move ``(r, c, digit)`` is legal in an empty cell whose row, column and
  box lack the digit; an illegal one changes nothing. Filled: solved, 1.
  An empty cell no digit fits: a dead end, over with nothing."""

  grid: list
  box: int
  max_steps: int
  steps: int = 0

  @property
  def size(self) -> int:
    return self.box * self.box

  def fits(self, r: int, c: int, digit: int) -> bool:
    if self.grid[r][c]:
      return False
    b = self.box
    box = [
      self.grid[i][j]
      for i in range(r // b * b, r // b * b + b)
      for j in range(c // b * b, c // b * b + b)
    ]
    column = [row[c] for row in self.grid]
    return digit not in self.grid[r] + column + box

  def moves(self) -> list:
    n = range(self.size)
    return [
      (r, c, d)
      for r in n
      for c in n
      for d in range(1, self.size + 1)
      if self.fits(r, c, d)
    ]

  def solved(self) -> bool:
    return all(all(row) for row in self.grid)

  def terminal(self) -> bool:
    return self.solved() or not self.moves()

  def step(self, r: int, c: int, digit: int) -> StepResult:
    legal = self.fits(r, c, digit)
    if legal and not self.terminal() and self.steps < self.max_steps:
      self.grid[r][c] = digit
      self.steps += 1
      effective, reward = True, 1.0 if self.solved() else 0.0
    else:
      effective, reward = False, 0.0
    terminal = self.terminal()
    return StepResult(
      reward=reward,
      terminated=terminal,
      truncated=self.steps >= self.max_steps and not terminal,
      success=self.solved(),
      valid=legal,
      effective=effective,
    )

  def text(self, mode: str = "grid") -> str:
    """``grid``: rows of digits, ``.`` empty; ``cells``: each cell as
    ``r1c2=4`` (``r1c2=.`` empty), spaces between, a row a line."""
    show = lambda v: str(v) if v else "."
    if mode == "grid":
      return "\n".join("".join(map(show, row)) for row in self.grid)
    return "\n".join(
      " ".join(f"r{r + 1}c{c + 1}={show(v)}" for c, v in enumerate(row))
      for r, row in enumerate(self.grid)
    )
