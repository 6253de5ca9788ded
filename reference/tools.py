"""Tool calls (envs/tools.py) in plain Python: the call grammar as regular
expressions, and the calculator's documented grammar: what an expression
built from parts evaluates to, or why it is refused.

An expression is built here as data, so its value comes from these rules,
not from parsing its text: numbers, ``+ - * / **``, unary signs and
parentheses evaluate exactly, left operand first; every intermediate
value's integer part and denominator at most 10**15 (that bound itself
allowed); exponents whole numbers up to 64 in size. Anything else Python's
expression syntax can say is refused (in any words: an expression
outside the grammar may meet another refusal first).
"""

from __future__ import annotations

import decimal
import operator
import re
from fractions import Fraction


def call(text: str) -> tuple[str, str] | str | None:
  """The call in a reply: ``(name, input)``, ``"malformed"``, or None (no
  call: none closed, or the answer closed first)."""
  m = re.search(r"<tool>(.*?)</tool>", text, re.S)
  if m is None or "</answer>" in text[: m.end()]:
    return None
  found = re.fullmatch(
    r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*?)\s*", m[1], re.S | re.A
  )
  if found is None:
    return "malformed"
  return (found[1], found[2])


LIMIT = 10**15
MAX_EXPONENT = 64

# Every refusal the calculator gives for an expression in its grammar.
TOO_LARGE = "number too large"
ZERO = "division by zero"
EXPONENT = "exponents"

GRAMMAR = {
  "+": operator.add,
  "-": operator.sub,
  "*": operator.mul,
  "/": operator.truediv,
  "**": None,
}
# Python's other binary operators, comparisons and boolean operators: each
# joins two expressions into one outside the grammar.
OUTSIDE = (
  "//",
  "%",
  "@",
  "<<",
  ">>",
  "|",
  "^",
  "&",
  "<",
  "<=",
  "==",
  "!=",
  ">",
  ">=",
  "in",
  "not in",
  "is",
  "is not",
  "and",
  "or",
)


def bounded(value: Fraction) -> Fraction | str:
  if abs(value) > LIMIT or value.denominator > LIMIT:
    return TOO_LARGE
  return value


def apply(op: str, left: Fraction | str, right: Fraction | str):
  """``left op right`` (an operator of ``GRAMMAR``) as the grammar
  evaluates it: the first refusal met, left before right before the
  operation."""
  for side in (left, right):
    if isinstance(side, str):
      return side
  if op == "**":
    if right.denominator != 1 or abs(right) > MAX_EXPONENT:
      return EXPONENT
    if left == 0 and right < 0:
      return ZERO
    return bounded(left ** int(right))
  if op == "/" and right == 0:
    return ZERO
  return bounded(GRAMMAR[op](left, right))


def negate(value: Fraction | str) -> Fraction | str:
  return value if isinstance(value, str) else -value


def spelled(value: Fraction) -> str:
  """An exact value as the calculator writes it, from Python's decimal
  module: an integer, or up to six decimals, rounded half to even."""
  if value.denominator == 1:
    return str(value.numerator)
  d = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
  text = f"{d.quantize(decimal.Decimal('0.000001')):f}".rstrip("0").rstrip(".")
  return "0" if text in ("-0", "0") else text
