"""A host-side Countdown solver, for problems read from a file (generated
problems carry their solution: the signs they were drawn with).

``solve`` first tries each number added or subtracted once (the family the
generator draws from, spelled like it: ``"12 + 7 - 3"``), then every
binary tree over every order with ``+ - * /`` in exact fractions, printed
with only the parentheses the grammar needs (``"(2 + 4)*5 - 6"``).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

# Printed operators and how tightly each binds.
_SPELLING = {"+": " + ", "-": " - ", "*": "*", "/": "/"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_APPLY = {
  "+": lambda a, b: a + b,
  "-": lambda a, b: a - b,
  "*": lambda a, b: a * b,
  "/": lambda a, b: a / b,
}


def solve(nums: list[int], target: int) -> str | None:
  """An expression using each of ``nums`` once that equals ``target``, or
  None when there is none."""
  flat = _signed_sum(nums, target)
  return flat if flat is not None else _search(nums, target)


def _signed_sum(nums: list[int], target: int) -> str | None:
  """Each number added or subtracted once, the added ones first."""
  for signs in itertools.product((1, -1), repeat=len(nums)):
    pairs = list(zip(signs, nums, strict=True))
    plus = [n for s, n in pairs if s > 0]
    minus = [n for s, n in pairs if s < 0]
    if not plus or sum(plus) - sum(minus) != target:
      continue
    return " + ".join(map(str, plus)) + "".join(f" - {n}" for n in minus)
  return None


def _search(nums: list[int], target: int) -> str | None:
  """Depth-first over pairs combined by an operator; items are (value,
  text, precedence of the text's outermost operator)."""

  def wrap(text: str, precedence: int, need: int) -> str:
    return f"({text})" if precedence < need else text

  def search(items):
    if len(items) == 1:
      return items[0][1] if items[0][0] == target else None
    for i, j in itertools.permutations(range(len(items)), 2):
      (a, ta, pa), (b, tb, pb) = items[i], items[j]
      rest = [items[k] for k in range(len(items)) if k not in (i, j)]
      for op in "+-*/":
        if op == "/" and b == 0:
          continue
        value = _APPLY[op](a, b)
        p = _PRECEDENCE[op]
        # Left associativity: the right operand of - and / needs
        # parentheses at equal precedence too.
        right_need = p + 1 if op in "-/" else p
        text = wrap(ta, pa, p) + _SPELLING[op] + wrap(tb, pb, right_need)
        found = search([*rest, (value, text, p)])
        if found is not None:
          return found
    return None

  return search([(Fraction(n), str(n), _ATOM) for n in nums])
