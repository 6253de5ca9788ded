"""Tools an agent may call before it answers: ``<tool>NAME: INPUT</tool>``.

An environment offers tools by name (``EnvSpec.tools``; Countdown and QA
take ``tools="calculator"``). A reply that calls one ends at ``</tool>``
(decoding stops there, as it does at ``</answer>``); the environment is
not stepped, and the next turn's observation is the result,
``<result>OUTPUT</result>``, followed by the environment's unchanged
observation. A call spends a turn (``rollout.max_turns``), not an action.

The call grammar (``parse_call``): the first ``<tool>`` of the reply and
the first ``</tool>`` after it, when no ``</answer>`` comes before that
``</tool>``; the content between them is ``NAME:INPUT``, NAME an ASCII
identifier (whitespace around it allowed), INPUT the rest, trimmed. Content
of any other shape, or a NAME the environment does not offer, is a
malformed call: the result says why and the turn costs the format penalty.
A ``<tool>`` never closed is no call at all.

A tool is a plain Python function from its input text to its output text,
run on the host with its input size and time bounded (``Tool``); raising
``ToolError`` (or any exception) returns ``error: MESSAGE`` to the agent.
Bring your own with ``register(Tool(...))``. Nothing here executes the
agent's text as code: the calculator reads Python's expression syntax tree
and evaluates only numbers, ``+ - * / **`` and parentheses, exactly, on
bounded magnitudes.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import threading
from collections.abc import Callable
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

TOOL_OPEN = "<tool>"


TOOL_CLOSE = "</tool>"


ANSWER_CLOSE = "</answer>"


RESULT_OPEN = "<result>"


RESULT_CLOSE = "</result>"


class ToolError(Exception):
  """What a tool tells the agent went wrong with its input."""


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool: ``run(input) -> output``, run on the host.

  Attributes:
    name: what a call names (an ASCII identifier).
    description: one line for the system prompt, with an example call.
    run: the function; raises ``ToolError`` for input it rejects.
    pieces: the strings inputs are made of (a vocabulary restricted to
      answers allows them).
    max_input: longest input in characters; a longer one is rejected
      without running.
    timeout_s: the longest one call may take; a slower one returns an
      error (the rollout waits no longer).
  """

  name: str
  description: str
  run: Callable[[str], str]
  pieces: tuple[str, ...] = ()
  max_input: int = 200
  timeout_s: float = 1.0

  def __post_init__(self) -> None:
    if not _identifier(self.name):
      raise ValueError(f"tool name {self.name!r} is not an ASCII identifier")
    if self.max_input < 1 or not self.timeout_s > 0:
      raise ValueError(
        f"tool {self.name!r}: max_input={self.max_input} and "
        f"timeout_s={self.timeout_s} must be positive"
      )


@dataclasses.dataclass(frozen=True)
class Call:
  """A well-formed call: the tool's name and its input."""

  name: str
  input: str


def _identifier(text: str) -> bool:
  return (
    bool(text)
    and text.isascii()
    and text.isidentifier()
    and not text[0].isdigit()
  )


_SPACE = " \t\n\r\x0b\x0c"


def parse_call(text: str) -> Call | str | None:
  """The tool call in a reply's text (module docstring's grammar).

  Returns:
    ``None`` when the reply calls no tool; a ``Call``; or, for a
    malformed call, a message saying what is wrong.
  """
  start = text.find(TOOL_OPEN)
  if start < 0:
    return None
  end = text.find(TOOL_CLOSE, start + len(TOOL_OPEN))
  if end < 0:
    return None
  stop = text.find(ANSWER_CLOSE)
  if stop >= 0 and stop + len(ANSWER_CLOSE) <= end + len(TOOL_CLOSE):
    return None  # the answer closed first: an answer turn
  content = text[start + len(TOOL_OPEN) : end]
  colon = content.find(":")
  name = content[:colon].strip(_SPACE) if colon >= 0 else ""
  if colon < 0 or not _identifier(name):
    return "not NAME: INPUT"
  return Call(name, content[colon + 1 :].strip(_SPACE))


# ---------------------------------------------------------------------------
# The calculator

# Bounds that keep every evaluation small: the integer parts and
# denominators of every intermediate value, and the syntax tree's size.
_MAX_MAGNITUDE = 10**15
_MAX_NODES = 64
_MAX_EXPONENT = 64

_BINARY = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: a / b,
}


def _bounded(value: Fraction) -> Fraction:
  if abs(value) > _MAX_MAGNITUDE or value.denominator > _MAX_MAGNITUDE:
    raise ToolError("number too large")
  return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
  if exponent.denominator != 1 or abs(exponent) > _MAX_EXPONENT:
    raise ToolError(f"exponents are whole numbers up to {_MAX_EXPONENT}")
  if base == 0 and exponent < 0:
    raise ToolError("division by zero")
  e = int(exponent)
  top, bottom = base.numerator, base.denominator
  if e < 0:
    top, bottom = bottom, top
  # The result's size and denominator in digits, from logarithms, refuse a
  # power far too large before it is computed (a digit's margin for
  # rounding: ``_bounded`` decides exactly).
  digits = lambda n: math.log10(abs(n)) if n else 0.0
  size = abs(e) * (digits(top) - digits(bottom))
  if size > 16 or abs(e) * digits(bottom) > 16:
    raise ToolError("number too large")
  return base**e


def _evaluate(node: ast.AST) -> Fraction:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant):
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ToolError(f"{value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
      raise ToolError("number too large")
    # A decimal literal is the decimal it spells (0.1 is 1/10), not the
    # binary float nearest it.
    return _bounded(
      Fraction(repr(value) if isinstance(value, float) else value)
    )
  if isinstance(node, ast.UnaryOp) and isinstance(
    node.op, (ast.USub, ast.UAdd)
  ):
    value = _evaluate(node.operand)
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, ast.BinOp):
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow):
      return _bounded(_power(left, right))
    op = _BINARY.get(type(node.op))
    if op is None:
      raise ToolError("only + - * / ** and parentheses")
    if isinstance(node.op, ast.Div) and right == 0:
      raise ToolError("division by zero")
    return _bounded(op(left, right))
  raise ToolError("only numbers, + - * / ** and parentheses")


def _format(value: Fraction) -> str:
  """An exact result: an integer, or a decimal rounded to 6 places (half
  to even, on the exact value, not a float)."""
  if value.denominator == 1:
    return str(value.numerator)
  millionths = round(value * 10**6)
  whole, frac = divmod(abs(millionths), 10**6)
  text = f"{whole}.{frac:06d}".rstrip("0").rstrip(".")
  return "-" + text if millionths < 0 else text


def calculate(expression: str) -> str:
  """Evaluates arithmetic exactly: numbers, ``+ - * / **``, unary signs and
  parentheses (Python's syntax and precedence). Never runs the text: its
  syntax tree is read and only those nodes are evaluated.

  Raises:
    ToolError: anything else, a division by zero, or a number (any
      intermediate value's integer part or denominator) above 10**15.
  """
  if not expression.strip():
    raise ToolError("empty expression")
  try:
    tree = ast.parse(expression.strip(), mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise ToolError("not an arithmetic expression") from e
  if sum(1 for _ in ast.walk(tree)) > _MAX_NODES:
    raise ToolError(f"more than {_MAX_NODES} parts")
  return _format(_evaluate(tree))


CALCULATOR = Tool(
  name="calculator",
  description=(
    f"{TOOL_OPEN}calculator: (12 + 3) * 4{TOOL_CLOSE} evaluates + - * / "
    "and parentheses"
  ),
  run=calculate,
  pieces=(*"0123456789", "+", "-", "*", "/", "(", ")", ".", " "),
)


TOOLS: dict[str, Tool] = {CALCULATOR.name: CALCULATOR}


def register(tool: Tool) -> None:
  """Makes ``tool`` available to environments by its name.

  Raises:
    ValueError: a different tool already has that name.
  """
  old = TOOLS.get(tool.name)
  if old is not None and old is not tool:
    raise ValueError(f"a tool named {tool.name!r} is already registered")
  TOOLS[tool.name] = tool


def names(tools: str | tuple[str, ...]) -> tuple[str, ...]:
  """Tool names from an environment's ``tools`` setting (``"a,b"`` or a
  tuple), checked against the registry.

  Raises:
    ValueError: a name no tool has, naming the registered ones.
  """
  if isinstance(tools, str):
    tools = tuple(t.strip() for t in tools.split(",") if t.strip())
  for name in tools:
    if name not in TOOLS:
      raise ValueError(f"unknown tool {name!r}; registered: {sorted(TOOLS)}")
  return tuple(dict.fromkeys(tools))


# ---------------------------------------------------------------------------
# Running calls from the compiled rollout


@struct.dataclass
class Results:
  """What the replies' tool calls did, per episode ``[B]`` (``tokens``
  ``[B, tool_tokens]``: the result text in the run's tokenizer)."""

  called: jax.Array  # the reply calls a tool (well-formed or not)
  malformed: jax.Array  # the call's shape or tool name is wrong
  failed: jax.Array  # the tool rejected its input, raised or timed out
  tokens: jax.Array
  length: jax.Array
  cut: jax.Array  # the result was longer than its budget


@dataclasses.dataclass(frozen=True, eq=False)
class ToolBox:
  """An environment's tools bound to the run's tokenizer: ``__call__``
  runs the batch's calls in ONE host call (``io_callback``) inside the
  compiled step. Calls run in threads, each waited for at most its
  tool's ``timeout_s``."""

  tools: tuple[Tool, ...]
  encode: Callable[[str], list[int]]
  budget: int

  @classmethod
  def build(
    cls, tools: tuple[str, ...], encode: Callable[[str], list[int]], budget: int
  ) -> ToolBox:
    least = len(encode(RESULT_OPEN)) + len(encode(RESULT_CLOSE + "\n")) + 1
    if budget < least:
      raise ValueError(
        f"tool_tokens={budget}: a result needs at least {least} tokens"
      )
    return cls(tuple(TOOLS[n] for n in names(tools)), encode, budget)

  def run(self, texts: list[str | None]) -> dict[str, np.ndarray]:
    """The calls in ``texts`` (``None``: the episode is not playing), on
    the host: arrays ``Results`` is made of."""
    b = len(texts)
    out = dict(
      called=np.zeros((b,), bool),
      malformed=np.zeros((b,), bool),
      failed=np.zeros((b,), bool),
      tokens=np.zeros((b, self.budget), np.int32),
      length=np.zeros((b,), np.int32),
      cut=np.zeros((b,), bool),
    )
    by_name = {t.name: t for t in self.tools}
    outputs: dict[int, str] = {}
    running = []
    for i, text in enumerate(texts):
      call = None if text is None else parse_call(text)
      if call is None:
        continue
      out["called"][i] = True
      if isinstance(call, str):
        out["malformed"][i] = True
        outputs[i] = f"error: {call}"
        continue
      tool = by_name.get(call.name)
      if tool is None:
        out["malformed"][i] = True
        outputs[i] = f"error: no tool {call.name!r} ({', '.join(by_name)})"
        continue
      if len(call.input) > tool.max_input:
        out["failed"][i] = True
        outputs[i] = f"error: input longer than {tool.max_input} characters"
        continue
      box: dict[str, str] = {}
      thread = threading.Thread(
        target=_run_one, args=(tool, call.input, box), daemon=True
      )
      thread.start()
      running.append((i, tool, thread, box))
    for i, tool, thread, box in running:
      thread.join(tool.timeout_s)
      if thread.is_alive():
        box = {"error": f"no result within {tool.timeout_s:g} s"}
      out["failed"][i] = "error" in box
      outputs[i] = box.get("output", f"error: {box.get('error')}")
    # A result too long for its budget is cut before its closing tag.
    close = list(self.encode(RESULT_CLOSE + "\n"))
    room = self.budget - len(close)
    for i, output in outputs.items():
      ids = list(self.encode(RESULT_OPEN + output))
      out["cut"][i] = len(ids) > room
      ids = ids[:room] + close
      out["tokens"][i, : len(ids)] = ids
      out["length"][i] = len(ids)
    return out

  def __call__(
    self, data: jax.Array, count: jax.Array, active: jax.Array
  ) -> Results:
    """Runs the calls of replies ``data [B, N]`` (bytes, ``count [B]``
    used) of the episodes ``active [B]`` plays."""
    b = data.shape[0]
    fields = [f.name for f in dataclasses.fields(Results)]
    shapes = {
      "tokens": jax.ShapeDtypeStruct((b, self.budget), jnp.int32),
      "length": jax.ShapeDtypeStruct((b,), jnp.int32),
    }

    def host(data, count, active):
      data, count = np.asarray(data), np.asarray(count)
      texts = [
        bytes(data[i, : count[i]].astype(np.uint8)).decode("utf-8", "replace")
        if live
        else None
        for i, live in enumerate(np.asarray(active).tolist())
      ]
      out = self.run(texts)
      return tuple(out[f] for f in fields)

    got = io_callback(
      host,
      tuple(
        shapes.get(f, jax.ShapeDtypeStruct((b,), jnp.bool_)) for f in fields
      ),
      data,
      count,
      active,
    )
    return Results(**dict(zip(fields, got, strict=True)))


def _run_one(tool: Tool, text: str, box: dict[str, str]) -> None:
  """One call, in its own thread: ``box`` gets its output or error."""
  try:
    output = tool.run(text)
    if not isinstance(output, str):
      raise ToolError(f"returned {type(output).__name__}, not text")
    box["output"] = output
  except ToolError as e:
    box["error"] = str(e)
  except Exception as e:  # a tool's bug fails its call only
    box["error"] = f"{type(e).__name__}: {e}"
