"""XLA's optimized HLO text (``compiled.as_text()``) read into
computations and instructions, with the sizes of their types: what
``hlo_cost`` walks to count a program's FLOPs and bytes."""

from __future__ import annotations

import dataclasses
import math
import re

_BYTES = {
  "pred": 1,
  "s4": 0.5,
  "u4": 0.5,
  "s8": 1,
  "u8": 1,
  "f8e4m3fn": 1,
  "f8e5m2": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_LAID_OUT = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
NAME = re.compile(r"%[\w.\-]+")


@dataclasses.dataclass
class Instruction:
  name: str
  type: str  # the output type text, e.g. "f32[8,64]{1,0}" or a tuple
  opcode: str
  operands: list[str]
  args: str  # the text between the opcode's parentheses
  attributes: str
  op_name: str


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  types: dict[str, str]  # every value's type: parameters and results
  by_name: dict[str, Instruction] = dataclasses.field(default_factory=dict)
  users: dict[str, list[Instruction]] = dataclasses.field(default_factory=dict)
  root: Instruction | None = None


def elements(type_text: str) -> int:
  """Elements of every array in a type (a tuple's summed)."""
  return sum(
    math.prod(int(d) for d in dims.split(",") if d)
    for _, dims in ARRAY.findall(type_text)
  )


def size_bytes(type_text: str) -> float:
  """Bytes of every array in a type (a tuple's summed)."""
  return sum(
    _BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    for dtype, dims in ARRAY.findall(type_text)
  )


def hbm_bytes(type_text: str) -> float:
  """Bytes of the arrays of a type that live in device memory: an array
  whose layout names another memory space (``S(n)``, n > 0: where XLA's
  TPU memory-space assignment keeps a buffer on chip) moves no HBM
  bytes."""
  return sum(
    _BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    for dtype, dims, layout in _LAID_OUT.findall(type_text)
    if not re.search(r"S\([1-9]\d*\)", layout)
  )


def shape(type_text: str) -> list[int]:
  match = ARRAY.search(type_text)
  if match is None:
    return []
  return [int(d) for d in match.group(2).split(",") if d]


def matching(text: str, start: int) -> int:
  """Index just past the bracket group opening at ``text[start]``."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  depth, closing = 0, pairs[text[start]]
  for i in range(start, len(text)):
    if text[i] == text[start]:
      depth += 1
    elif text[i] == closing:
      depth -= 1
      if depth == 0:
        return i + 1
  raise ValueError(f"unbalanced HLO text: {text[start : start + 80]!r}")


def _instruction(line: str) -> tuple[Instruction, bool] | None:
  """The instruction on a line, and whether it is its computation's root."""
  line = re.sub(r"/\*.*?\*/", "", line.strip())
  root = line.startswith("ROOT ")
  if root:
    line = line[5:]
  if not line.startswith("%") or " = " not in line:
    return None
  name, rest = line.split(" = ", 1)
  if rest.startswith("("):
    end = matching(rest, 0)
    type_text, rest = rest[:end], rest[end:].lstrip()
  else:
    type_text, rest = rest.split(" ", 1)
  opcode = rest[: rest.index("(")]
  end = matching(rest, len(opcode))
  args = rest[len(opcode) + 1 : end - 1]
  attributes = rest[end:]
  op_name = re.search(r'op_name="([^"]*)"', attributes)
  inst = Instruction(
    name=name,
    type=type_text,
    opcode=opcode,
    operands=NAME.findall(args),
    args=args,
    attributes=attributes,
    op_name=op_name.group(1) if op_name else "",
  )
  return inst, root


def _statements(text: str) -> list[str]:
  """The text's lines, an instruction that spans several (a TPU kernel's
  metadata holds line breaks) joined into one."""
  out: list[str] = []
  for raw in text.splitlines():
    starts = (
      not raw
      or raw == "}"
      or re.match(r"(\s+(ROOT )?%|(ENTRY )?%|HloModule)", raw) is not None
    )
    if starts or not out:
      out.append(raw)
    else:
      out[-1] += " " + raw
  return out


def parse(text: str) -> tuple[dict[str, Computation], str]:
  """The computations of an HLO module's text, and the entry's name."""
  comps: dict[str, Computation] = {}
  entry = ""
  current: Computation | None = None
  for raw in _statements(text):
    line = raw.strip()
    header = re.match(r"(ENTRY )?(%[\w.\-]+) \(.*\) -> .*\{$", line)
    if header and not raw.startswith(" "):
      # Parameters are instructions of the body; the header needs no parse.
      current = Computation(header.group(2), [], {})
      comps[current.name] = current
      if header.group(1):
        entry = current.name
      continue
    if current is None:
      continue
    if line == "}":
      current = None
      continue
    parsed = _instruction(line)
    if parsed is not None:
      inst, root = parsed
      current.instructions.append(inst)
      current.types[inst.name] = inst.type
      current.by_name[inst.name] = inst
      for operand in inst.operands:
        current.users.setdefault(operand, []).append(inst)
      if root:
        current.root = inst
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text")
  return comps, entry
