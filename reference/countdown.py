"""Countdown's rules in plain Python: expressions read by Python's own
parser (``ast``), values exact (``fractions``), RAGEN's reward, and a
brute-force solver. A reference for ``envs.jax.countdown``.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
from fractions import Fraction

ALPHABET = set(b"0123456789+-*/() \t\n\r\x0b\x0c")
_OPS = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
}


@dataclasses.dataclass
class Expression:
  ok: bool  # well formed in the grammar (integers, + - * /, signs, parens)
  value: Fraction | None  # exact; None when malformed or dividing by zero
  div_zero: bool
  numbers: list[int]  # literals, in order
  largest: Fraction  # largest magnitude of any intermediate value


def evaluate(text: bytes) -> Expression:
  """``text`` read as a Python expression restricted to the grammar."""
  bad = Expression(False, None, False, [], Fraction(0))
  if not set(text) <= ALPHABET:
    return bad
  source = re.sub(rb"\s", b" ", text).strip().decode()
  try:
    tree = ast.parse(source, mode="eval")
  except SyntaxError:
    return bad
  numbers: list[int] = []
  largest = [Fraction(0)]
  div_zero = [False]

  def walk(node) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
      numbers.append(node.value)
      out = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.USub, ast.UAdd)
    ):
      inner = walk(node.operand)
      out = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
      a, b = walk(node.left), walk(node.right)
      if b == 0:
        div_zero[0] = True
        b = Fraction(1)
      out = a / b
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
      out = _OPS[type(node.op)](walk(node.left), walk(node.right))
    else:
      raise ValueError(type(node).__name__)
    largest[0] = max(largest[0], abs(out))
    return out

  try:
    value = walk(tree.body)
  except ValueError:
    return bad
  return Expression(
    True, None if div_zero[0] else value, div_zero[0], numbers, largest[0]
  )


def reward(
  answer: bytes,
  target: int,
  nums: list[int],
  score: float = 1.0,
  format_score: float = 0.1,
  max_bytes: int = 128,
) -> float:
  """RAGEN's ``compute_reward``, with a malformed answer scoring 0."""
  e = evaluate(answer)
  if len(answer) > max_bytes or not e.ok:
    return 0.0
  if sorted(e.numbers) != sorted(nums):
    return 0.0
  if e.value is not None and abs(e.value - target) <= 1e-6 * max(
    1, abs(target)
  ):
    return score
  return format_score


def solve(nums: list[int], target: int) -> str | None:
  """An expression using each number once that equals ``target``, or None:
  every binary tree over every order with + - * /."""

  def search(items: list[tuple[Fraction, str]]):
    if len(items) == 1:
      if items[0][0] == target:
        return items[0][1]
      return None
    for i, j in itertools.permutations(range(len(items)), 2):
      (a, sa), (b, sb) = items[i], items[j]
      rest = [items[k] for k in range(len(items)) if k not in (i, j)]
      options = [(a + b, "+"), (a - b, "-"), (a * b, "*")]
      if b != 0:
        options.append((a / b, "/"))
      for value, op in options:
        found = search([*rest, (value, f"({sa} {op} {sb})")])
        if found:
          return found
    return None

  return search([(Fraction(n), str(n)) for n in nums])
