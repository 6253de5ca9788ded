"""Arithmetic expressions evaluated from bytes inside ``jit``.

The grammar is Python's for integer literals, ``+ - * /``, unary ``-`` and
``+`` and parentheses: ``*`` and ``/`` bind tighter than ``+`` and ``-``,
all four associate to the left, a unary sign binds tighter than either,
``/`` is true division, and an integer literal may not start with ``0``
unless it is all zeros (``007`` is a syntax error in Python 3). Whitespace
(space, tab, newline, CR, VT, FF) may stand between tokens. Anything else
(another character, two operands in a row, an operator missing an operand,
unbalanced parentheses, an empty expression) is malformed.

``evaluate`` is an operator-precedence (shunting-yard) machine run by one
``lax.fori_loop`` over the bytes, with the operand and operator stacks as
fixed-size arrays, so it ``vmap``s over a batch of answers. Values are
float32: integers are exact below 2**24, and division by zero is flagged
rather than producing ``inf`` (Python raises ``ZeroDivisionError``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# Operator codes on the operator stack, and their binding strength; "("
# binds nothing, so reductions stop at it.
_OPEN, _ADD, _SUB, _MUL, _DIV, _NEG = range(6)
_PRECEDENCE = (0, 1, 1, 2, 2, 3)
_DIGIT0 = ord("0")
_WHITESPACE = tuple(b" \t\n\r\x0b\x0c")
_BINARY = {ord("+"): _ADD, ord("-"): _SUB, ord("*"): _MUL, ord("/"): _DIV}


@struct.dataclass
class Result:
  """What an expression is."""

  ok: jax.Array  # [] bool: well formed
  value: jax.Array  # [] float32, meaningful when ok and not div_zero
  div_zero: jax.Array  # [] bool: it divides by zero
  numbers: jax.Array  # [max_numbers] float32 literals in order, then 0
  count: jax.Array  # [] int32 literals (may exceed max_numbers)


@struct.dataclass
class _Machine:
  values: jax.Array  # [S] float32 operand stack
  num_values: jax.Array  # [] int32
  ops: jax.Array  # [S] int32 operator stack
  num_ops: jax.Array  # [] int32
  expect_operand: jax.Array  # [] bool
  in_number: jax.Array  # [] bool: inside a run of digits
  number: jax.Array  # [] float32 value of the run so far
  leading_zero: jax.Array  # [] bool: the run starts with "0" ...
  nonzero: jax.Array  # [] bool: ... and has a non-zero digit
  error: jax.Array  # [] bool
  div_zero: jax.Array  # [] bool
  numbers: jax.Array  # [M] float32
  count: jax.Array  # [] int32


def _apply(m: _Machine) -> _Machine:
  """Pops the top operator and applies it to the operand stack."""
  op = m.ops[jnp.maximum(m.num_ops - 1, 0)]
  unary = op == _NEG
  b = m.values[jnp.maximum(m.num_values - 1, 0)]
  a = m.values[jnp.maximum(m.num_values - 2, 0)]
  missing = m.num_values < jnp.where(unary, 1, 2)
  zero = (op == _DIV) & (b == 0)
  value = jnp.select(
    [unary, op == _ADD, op == _SUB, op == _MUL],
    [-b, a + b, a - b, a * b],
    a / jnp.where(zero, 1.0, b),
  )
  at = m.num_values - jnp.where(unary, 1, 2)
  return m.replace(
    values=m.values.at[jnp.maximum(at, 0)].set(value),
    num_values=jnp.maximum(at + 1, 0),
    num_ops=m.num_ops - 1,
    error=m.error | missing,
    div_zero=m.div_zero | zero,
  )


def _reduce(m: _Machine, min_precedence: int | jax.Array) -> _Machine:
  """Applies stacked operators while the top one binds at least as tightly
  as ``min_precedence`` (left associativity)."""
  precedence = jnp.asarray(_PRECEDENCE, jnp.int32)

  def top_binds(m: _Machine) -> jax.Array:
    top = m.ops[jnp.maximum(m.num_ops - 1, 0)]
    return (m.num_ops > 0) & (precedence[top] >= min_precedence)

  return jax.lax.while_loop(top_binds, _apply, m)


def _push_op(m: _Machine, op: int | jax.Array) -> _Machine:
  return m.replace(ops=m.ops.at[m.num_ops].set(op), num_ops=m.num_ops + 1)


def _end_number(m: _Machine) -> _Machine:
  """Pushes the run of digits just read, if any, as an operand."""
  done = m.in_number
  width = m.numbers.shape[0]
  pushed = m.replace(
    values=m.values.at[m.num_values].set(m.number),
    num_values=m.num_values + 1,
    numbers=m.numbers.at[jnp.minimum(m.count, width - 1)].set(
      jnp.where(m.count < width, m.number, m.numbers[width - 1])
    ),
    count=m.count + 1,
    error=m.error | ~m.expect_operand | (m.leading_zero & m.nonzero),
    expect_operand=jnp.zeros((), bool),
    in_number=jnp.zeros((), bool),
  )
  return jax.tree.map(lambda p, o: jnp.where(done, p, o), pushed, m)


def _read(m: _Machine, byte: jax.Array) -> _Machine:
  """One byte of the expression."""
  digit = (byte >= _DIGIT0) & (byte <= _DIGIT0 + 9)
  m = jax.lax.cond(digit, lambda m: m, _end_number, m)
  d = (byte - _DIGIT0).astype(jnp.float32)
  first = digit & ~m.in_number
  m = m.replace(
    number=jnp.where(digit, jnp.where(first, 0.0, m.number) * 10 + d, m.number),
    leading_zero=jnp.where(first, byte == _DIGIT0, m.leading_zero),
    nonzero=jnp.where(first, False, m.nonzero) | (digit & (byte != _DIGIT0)),
    in_number=m.in_number | digit,
  )
  binary = jnp.asarray([_BINARY.get(b, -1) for b in range(256)], jnp.int32)
  op = binary[byte]
  is_op = op >= 0
  space = jnp.isin(byte, jnp.asarray(_WHITESPACE))
  opening, closing = byte == ord("("), byte == ord(")")
  known = digit | is_op | space | opening | closing
  branch = jnp.select(
    [is_op & m.expect_operand, is_op, opening, closing], [0, 1, 2, 3], 4
  )
  m = jax.lax.switch(
    branch,
    [
      lambda m: _sign(m, op),
      lambda m: _binary(m, op),
      lambda m: _open(m),
      lambda m: _close(m),
      lambda m: m,
    ],
    m,
  )
  return m.replace(error=m.error | ~known)


def _sign(m: _Machine, op: jax.Array) -> _Machine:
  """An operator where an operand is expected: a unary sign, or an error."""
  m = jax.lax.cond(op == _SUB, lambda m: _push_op(m, _NEG), lambda m: m, m)
  return m.replace(error=m.error | (op == _MUL) | (op == _DIV))


def _binary(m: _Machine, op: jax.Array) -> _Machine:
  m = _reduce(m, jnp.asarray(_PRECEDENCE, jnp.int32)[op])
  return _push_op(m, op).replace(expect_operand=jnp.ones((), bool))


def _open(m: _Machine) -> _Machine:
  return _push_op(m.replace(error=m.error | ~m.expect_operand), _OPEN)


def _close(m: _Machine) -> _Machine:
  m = _reduce(m.replace(error=m.error | m.expect_operand), 1)
  matched = (m.num_ops > 0) & (m.ops[jnp.maximum(m.num_ops - 1, 0)] == _OPEN)
  return m.replace(
    num_ops=jnp.where(matched, m.num_ops - 1, m.num_ops),
    error=m.error | ~matched,
  )


def evaluate(
  data: jax.Array, length: jax.Array, max_numbers: int = 8
) -> Result:
  """Evaluates the expression in ``data[:length]`` (bytes as integers).

  Args:
    data: ``[N]`` integer bytes; ``N`` bounds the work and the nesting.
    length: bytes used.
    max_numbers: literals recorded in ``Result.numbers`` (all are counted).
  """
  n = data.shape[0]
  stack = n + 1
  m = _Machine(
    values=jnp.zeros((stack,), jnp.float32),
    num_values=jnp.zeros((), jnp.int32),
    ops=jnp.zeros((stack,), jnp.int32),
    num_ops=jnp.zeros((), jnp.int32),
    expect_operand=jnp.ones((), bool),
    in_number=jnp.zeros((), bool),
    number=jnp.zeros((), jnp.float32),
    leading_zero=jnp.zeros((), bool),
    nonzero=jnp.zeros((), bool),
    error=jnp.zeros((), bool),
    div_zero=jnp.zeros((), bool),
    numbers=jnp.zeros((max_numbers,), jnp.float32),
    count=jnp.zeros((), jnp.int32),
  )
  data = jnp.asarray(data, jnp.int32)
  m = jax.lax.fori_loop(
    0,
    jnp.minimum(length, n),
    lambda i, m: _read(m, data[i]),
    m,
  )
  m = _end_number(m)
  m = _reduce(m.replace(error=m.error | m.expect_operand), 1)
  ok = ~m.error & (m.num_ops == 0) & (m.num_values == 1)
  return Result(
    ok=ok,
    value=jnp.where(ok, m.values[0], 0.0),
    div_zero=ok & m.div_zero,
    numbers=m.numbers,
    count=m.count,
  )
