"""FLOPs and bytes of a compiled XLA program, with loops counted as they
run, by phase: what ``compile_check`` turns into a roofline estimate.

XLA's own ``cost_analysis()`` counts the body of a loop once, however many
times it runs: for the StarPO step (a scan over turns, a decode loop over
tokens, a scan over minibatches) it undercounts by orders of magnitude.
This walks the optimized HLO text instead (``compiled.as_text()``):

* FLOPs: a ``dot`` is ``2 * output elements * contracted size``, a
  ``convolution`` (what a matmul becomes in XLA's TPU programs) twice
  its multiply-adds over the kernel taps that meet real input; an
  elementwise arithmetic op one per output element, a ``reduce`` one per
  input element (XLA's own conventions). Inside a fusion they count as
  the fusion's. A TPU kernel (``custom-call``, e.g. splash attention)
  hides its FLOPs: those calls are counted in ``opaque_calls``.
* Bytes: what each top-level instruction (a fusion, a copy, a dot, ...)
  reads and writes at its boundary; tuples, parameters and bitcasts move
  nothing; an operand only sliced reads the slice, an update in place
  writes the update (XLA's conventions).
* Loops: a ``while`` multiplies its body by XLA's ``known_trip_count``,
  or, where XLA left none (its TPU programs), by the count of a counted
  loop read off its condition and body; one without (a data-dependent
  loop) by the bound given for the named scope it runs in (``bounds``,
  e.g. ``{"decode": max_new_tokens}``), or once, counted in
  ``unbounded_loops``. A ``conditional`` counts its most
  expensive branch.
* Phases: the first named scope under the jitted function in each
  instruction's ``op_name`` (the step's ``collect``, ``score``,
  ``update``, ...); anything else is ``"other"``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping

from starpo_jax.cli.hlo_text import (
  ARRAY,
  NAME,
  Computation,
  Instruction,
  elements,
  hbm_bytes,
  matching,
  parse,
  shape,
  size_bytes,
)

_ELEMENTWISE = frozenset(
  [
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "negate",
    "abs",
    "exponential",
    "exponential-minus-one",
    "log",
    "log-plus-one",
    "tanh",
    "logistic",
    "sqrt",
    "rsqrt",
    "cbrt",
    "power",
    "remainder",
    "sine",
    "cosine",
    "tan",
    "atan2",
    "erf",
    "floor",
    "ceil",
    "round-nearest-even",
    "round-nearest-afz",
    "sign",
  ]
)
# Instructions that read only part of their first operand.
_SLICING = frozenset(["dynamic-slice", "slice", "gather"])
# XLA's TPU bookkeeping calls: they compute and move nothing.
_FREE_CALLS = frozenset(
  ["AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound"]
)
# Matmuls of a (causal) splash-attention kernel per block pair: the
# forward's QK^T and PV; dq recomputes QK^T, then dO V^T and dS K; dkv
# recomputes QK^T, then P^T dO, dO V^T and dS^T Q.
_SPLASH = {"fwd": (2, ""), "dq": (3, "_dq"), "dkv": (4, "_dkv")}
# Instructions that move no data of their own.
_FREE = frozenset(
  [
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "constant",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
  ]
)


@dataclasses.dataclass
class Cost:
  """A program's cost by phase, and what it could not count."""

  flops: dict[str, float] = dataclasses.field(default_factory=dict)
  bytes: dict[str, float] = dataclasses.field(default_factory=dict)
  unbounded_loops: list[str] = dataclasses.field(default_factory=list)
  opaque_calls: int = 0

  def add(self, phase: str, flops: float, nbytes: float) -> None:
    self.flops[phase] = self.flops.get(phase, 0.0) + flops
    self.bytes[phase] = self.bytes.get(phase, 0.0) + nbytes

  def merge(self, other: Cost, times: float) -> None:
    for phase in set(other.flops) | set(other.bytes):
      self.add(
        phase,
        other.flops.get(phase, 0.0) * times,
        other.bytes.get(phase, 0.0) * times,
      )
    self.unbounded_loops += other.unbounded_loops
    self.opaque_calls += other.opaque_calls

  @property
  def total_flops(self) -> float:
    return sum(self.flops.values())

  @property
  def total_bytes(self) -> float:
    return sum(self.bytes.values())

  def roofline_seconds(self, flops_per_s: float, bytes_per_s: float) -> float:
    """A lower bound of the time: each phase at least its FLOPs at the
    peak FLOP rate, or its bytes at the peak bandwidth, whichever is
    longer (a phase computes or moves data; it cannot beat both)."""
    return sum(
      max(
        self.flops.get(p, 0.0) / flops_per_s,
        self.bytes.get(p, 0.0) / bytes_per_s,
      )
      for p in set(self.flops) | set(self.bytes)
    )


def _phase(op_name: str, phases: tuple[str, ...] | None) -> str | None:
  parts = op_name.split("/")
  if len(parts) > 1 and parts[0].startswith("jit("):
    first = parts[1]
    if phases is None or first in phases:
      return first
  return None


def _called(inst: Instruction, key: str) -> list[str]:
  match = re.search(key + r"=\{?([^},]+(?:, *%[^},]+)*)\}?", inst.attributes)
  return NAME.findall(match.group(1)) if match else []


def _trip(
  inst: Instruction,
  comp: Computation,
  comps: Mapping[str, Computation],
  bounds: Mapping[str, int],
) -> int | None:
  """How many times a ``while`` runs: XLA's ``known_trip_count``, else
  a counted loop read off its condition and body, else its named scope's
  bound."""
  match = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', inst.attributes)
  if match:
    return int(match.group(1))
  counted = _counted(inst, comp, comps)
  if counted is not None:
    return counted
  # The innermost bounded scope: a block loop inside the decode loop
  # runs the block count, not the token count.
  for scope in reversed(inst.op_name.split("/")):
    if scope in bounds:
      return bounds[scope]
  return None


def _op(
  inst: Instruction | None, comp: Computation, comps: Mapping[str, Computation]
) -> tuple[str, list[Instruction | None], str]:
  """(opcode, operand instructions, attributes) of ``inst``, seen through
  a fusion that wraps a single operation of its parameters (how XLA's
  CPU programs hold a loop's compare and increment)."""
  if inst is None:
    return "", [], ""
  called = _called(inst, "calls") if inst.opcode == "fusion" else []
  if len(called) == 1 and comps[called[0]].root is not None:
    fused = comps[called[0]]
    params = [fused.by_name.get(o) for o in fused.root.operands]
    if params and all(
      p is not None and p.opcode == "parameter" for p in params
    ):
      outer = [comp.by_name.get(inst.operands[int(p.args)]) for p in params]
      return fused.root.opcode, outer, fused.root.attributes
  return (
    inst.opcode,
    [comp.by_name.get(o) for o in inst.operands],
    inst.attributes,
  )


def _copied(inst: Instruction | None, comp: Computation | None):
  """``inst`` seen through copies (how XLA's TPU programs move a loop
  counter between memory spaces)."""
  while inst is not None and comp is not None and inst.opcode == "copy":
    inst = comp.by_name.get(inst.operands[0])
  return inst


def _element(
  inst: Instruction | None, comp: Computation | None = None
) -> int | None:
  """The tuple index ``inst`` reads (through copies), if it is a
  ``get-tuple-element``."""
  inst = _copied(inst, comp)
  if inst is None or inst.opcode != "get-tuple-element":
    return None
  match = re.search(r"index=(\d+)", inst.attributes)
  return int(match.group(1)) if match else None


def _constant(
  inst: Instruction | None, comp: Computation | None = None
) -> int | None:
  """The integer ``inst`` holds if it is a constant (through copies)."""
  inst = _copied(inst, comp)
  if inst is None or inst.opcode != "constant":
    return None
  try:
    return int(inst.args)
  except ValueError:
    return None


def _counted(
  inst: Instruction, comp: Computation, comps: Mapping[str, Computation]
) -> int | None:
  """The trip count of a counted loop (XLA's TPU programs leave them
  unannotated): the condition is ``element k < N``, element k starts at a
  constant and the body adds a positive constant to it (2 in the SPMD
  partitioner's bidirectional windowed einsums). None for any other
  loop."""
  cond = [comps[c] for c in _called(inst, "condition")]
  body = [comps[c] for c in _called(inst, "body")]
  if len(cond) != 1 or len(body) != 1:
    return None
  opcode, (counter, limit), attributes = _pair(cond[0].root, cond[0], comps)
  if opcode != "compare" or "direction=LT" not in attributes:
    return None
  k, n = _element(counter, cond[0]), _constant(limit, cond[0])
  init = comp.by_name.get(inst.operands[0]) if inst.operands else None
  if k is None or n is None or init is None or init.opcode != "tuple":
    return None
  start = _constant(comp.by_name.get(init.operands[k]), comp)
  out = body[0].root
  if start is None or out is None or out.opcode != "tuple":
    return None
  opcode, operands, _ = _op(
    body[0].by_name.get(out.operands[k]), body[0], comps
  )
  if opcode != "add" or len(operands) != 2:
    return None
  steps = [_constant(o, body[0]) for o in operands]
  counters = [_element(o, body[0]) == k for o in operands]
  if counters not in ([True, False], [False, True]):
    return None
  step = steps[counters.index(False)]
  if step is None or step <= 0:
    return None
  return max(-(-(n - start) // step), 0)


def _pair(inst, comp, comps):
  """``_op`` of a binary operation: (opcode, (lhs, rhs), attributes)."""
  opcode, operands, attributes = _op(inst, comp, comps)
  if len(operands) != 2:
    return "", (None, None), ""
  return opcode, (operands[0], operands[1]), attributes


def _window(attributes: str) -> list[dict[str, list[int]]]:
  """A convolution's window, one dict per spatial dimension (size,
  stride, pad as [low, high], lhs_dilate, rhs_dilate)."""
  match = re.search(r"window=\{([^}]*)\}", attributes)
  if match is None:
    return []
  fields = dict(f.split("=", 1) for f in match.group(1).split())
  rank = len(fields["size"].split("x"))
  out = []
  for d in range(rank):
    dim = {
      key: int(fields[key].split("x")[d]) if key in fields else default
      for key, default in (
        ("size", 1),
        ("stride", 1),
        ("lhs_dilate", 1),
        ("rhs_dilate", 1),
      )
    }
    pad = fields.get("pad", "x".join(["0_0"] * rank)).split("x")[d]
    dim["pad"] = int(pad.split("_")[0])
    out.append(dim)
  return out


@functools.cache
def _valid_taps(
  out: int, size: int, inp: int, stride: int, pad: int, wdil: int, bdil: int
) -> int:
  """(output position, kernel tap) pairs of one spatial dimension that
  land on a real input element: not padding, not a hole of the input's
  dilation."""
  total = 0
  for k in range(size):
    for o in range(out):
      u = o * stride - pad + k * wdil
      if u >= 0 and u % bdil == 0 and u // bdil < inp:
        total += 1
  return total


def _convolution_flops(inst: Instruction, comp: Computation) -> float:
  """2 x multiply-adds: the input features of a group, times the output
  features, the batch of a group, and the kernel taps that meet real
  input along each spatial dimension (how XLA's TPU programs hold their
  matmuls)."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", inst.attributes)
  lhs = shape(comp.types.get(inst.operands[0], ""))
  rhs = shape(comp.types.get(inst.operands[1], ""))
  out = shape(inst.type)
  if labels is None or not lhs or not rhs or not out:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()

  def group(key: str) -> int:
    m = re.search(key + r"=(\d+)", inst.attributes)
    return int(m.group(1)) if m else 1

  fma = (
    lhs[lhs_l.index("f")]
    // group("feature_group_count")
    * out[out_l.index("f")]
    * (lhs[lhs_l.index("b")] // group("batch_group_count"))
  )
  for d, w in enumerate(_window(inst.attributes)):
    fma *= _valid_taps(
      out[out_l.index(str(d))],
      rhs[rhs_l.index(str(d))],
      lhs[lhs_l.index(str(d))],
      w["stride"],
      w["pad"],
      w["rhs_dilate"],
      w["lhs_dilate"],
    )
  return 2.0 * fma


def _target(inst: Instruction) -> str:
  """A ``custom-call``'s target ("" for any other instruction)."""
  if inst.opcode != "custom-call":
    return ""
  match = re.search(r'custom_call_target="([^"]*)"', inst.attributes)
  return match.group(1) if match else ""


def _splash_flops(inst: Instruction) -> float | None:
  """FLOPs of a causal splash-attention kernel (``splash_mha_fwd``,
  ``_dq``, ``_dkv``), which XLA cannot see inside: its matmuls over the
  block pairs a causal mask keeps, from the query and key shapes
  (``[batch, heads, length, head_dim]``) and the kernel's block sizes.
  None for any other kernel."""
  kind = re.match(r"%splash_mha_(fwd|dq|dkv)", inst.name)
  text = inst.attributes
  at = text.find("operand_layout_constraints={")
  constraints = (
    text[at : matching(text, text.index("{", at))] if at >= 0 else None
  )
  blocks = re.search(r'xprof_metadata":"(\{.*?\})"', text)
  if kind is None or constraints is None or blocks is None:
    return None
  # The queries, then the keys: [..., heads, length, head_dim].
  arrays = [
    [int(d) for d in dims.split(",")]
    for dtype, dims in ARRAY.findall(constraints)
    if dtype.startswith(("bf", "f")) and dims.count(",") >= 2
  ]
  if len(arrays) < 2:
    return None
  q, k = arrays[:2]
  matmuls, suffix = _SPLASH[kind.group(1)]
  sizes = json.loads(blocks.group(1).replace('\\"', '"'))
  bq, bk = sizes[f"block_q{suffix}"], sizes[f"block_kv{suffix}"]
  batch, (heads, length, dim) = math.prod(q[:-3]), q[-3:]
  pairs = sum(
    min(-(-k[-2] // bk), -(-min(length, (i + 1) * bq) // bk))
    for i in range(-(-length // bq))
  )
  return 2.0 * matmuls * batch * heads * pairs * bq * bk * dim


def _flops(inst: Instruction, comp: Computation) -> float:
  if inst.opcode == "convolution":
    return _convolution_flops(inst, comp)
  if inst.opcode == "dot":
    lhs = shape(comp.types.get(inst.operands[0], ""))
    contracting = re.search(
      r"lhs_contracting_dims=\{([0-9,]*)\}", inst.attributes
    )
    size = 1
    if contracting and lhs:
      size = math.prod(
        lhs[int(d)] for d in contracting.group(1).split(",") if d
      )
    return 2.0 * elements(inst.type) * size
  if inst.opcode in _ELEMENTWISE:
    return float(elements(inst.type))
  if inst.opcode == "reduce":
    return float(
      sum(
        elements(comp.types.get(o, ""))
        for o in inst.operands[: len(inst.operands) // 2]
      )
    )
  return 0.0


class _Walker:
  def __init__(self, comps, bounds, phases):
    self.comps, self.bounds, self.phases = comps, bounds, phases
    self._inner: dict[str, float] = {}

  def inner_flops(self, name: str) -> float:
    """FLOPs of a fused (or otherwise inlined) computation."""
    if name not in self._inner:
      comp = self.comps[name]
      total = 0.0
      for inst in comp.instructions:
        total += _flops(inst, comp)
        if inst.opcode == "fusion":
          total += sum(self.inner_flops(c) for c in _called(inst, "calls"))
      self._inner[name] = total
    return self._inner[name]

  def moved(self, inst: Instruction, comp: Computation) -> float:
    """HBM bytes an instruction reads and writes. An update in place (a
    ``dynamic-update-slice``, alone or at a fusion's root) reads its other
    operands and writes the slice, not the buffer it lands in (as XLA
    counts it). An asynchronous pair (``copy-start``/``copy-done``, ...)
    counts once, at its end: what the start read, what the end wrote."""
    if inst.opcode.endswith("-start"):
      return 0.0
    if inst.opcode.endswith("-done"):
      start = comp.by_name.get(inst.operands[0]) if inst.operands else None
      reads = (
        [hbm_bytes(comp.types.get(o, "")) for o in start.operands]
        if (start is not None)
        else []
      )
      if start is not None and start.opcode == "slice-start" and reads:
        reads = [size_bytes(inst.type) if reads[0] else 0.0]
      return sum(reads) + hbm_bytes(inst.type)
    sizes = [hbm_bytes(comp.types.get(o, "")) for o in inst.operands]
    if inst.opcode in _SLICING:
      sizes[0] = hbm_bytes(inst.type) if sizes[0] else 0.0
    elif inst.opcode == "fusion":
      for k, read in self._sliced_reads(inst).items():
        if k < len(sizes):
          sizes[k] = min(sizes[k], read)
    in_place = self._in_place(inst, comp)
    if in_place is None:
      return hbm_bytes(inst.type) + sum(sizes)
    buffer, written = in_place
    return sum(sizes) - sizes[buffer] + written

  def _sliced_reads(self, inst: Instruction) -> dict[int, float]:
    """A fusion's operands that it only slices (directly, or through a
    fusion nested in it that only slices them): operand index -> the bytes
    its slices read."""
    called = _called(inst, "calls")
    if len(called) != 1:
      return {}
    fused = self.comps[called[0]]
    out = {}
    for p in fused.instructions:
      if p.opcode != "parameter":
        continue
      read = 0.0
      for u in fused.users.get(p.name, []):
        if u.opcode in _SLICING and u.operands[0] == p.name:
          read += hbm_bytes(u.type)
          continue
        nested = self._sliced_reads(u) if u.opcode == "fusion" else {}
        at = [k for k, o in enumerate(u.operands) if o == p.name]
        if not at or any(k not in nested for k in at):
          break
        read += sum(nested[k] for k in at)
      else:
        if fused.users.get(p.name):
          out[int(p.args)] = read
    return out

  def _in_place(
    self, inst: Instruction, comp: Computation
  ) -> tuple[int, float] | None:
    """(the operand an in-place update writes into, the bytes it
    writes), or None when ``inst`` is no such update."""
    if inst.opcode == "dynamic-update-slice":
      return 0, hbm_bytes(comp.types.get(inst.operands[1], ""))
    called = _called(inst, "calls") if inst.opcode == "fusion" else []
    if len(called) != 1:
      return None
    fused = self.comps[called[0]]
    root = fused.root
    if root is None or root.opcode != "dynamic-update-slice":
      return None
    target = fused.by_name.get(root.operands[0])
    if target is None or target.opcode != "parameter":
      return None
    return int(target.args), hbm_bytes(fused.types.get(root.operands[1], ""))

  def walk(self, name: str, phase: str) -> Cost:
    comp = self.comps[name]
    cost = Cost()
    for inst in comp.instructions:
      here = _phase(inst.op_name, self.phases) or phase
      if inst.opcode == "while":
        body = Cost()
        for key in ("body", "condition"):
          for c in _called(inst, key):
            body.merge(self.walk(c, here), 1.0)
        trips = _trip(inst, comp, self.comps, self.bounds)
        if trips is None:
          cost.unbounded_loops.append(inst.op_name or inst.name)
          trips = 1
        cost.merge(body, trips)
      elif inst.opcode == "conditional":
        branches = [
          self.walk(c, here)
          for key in (
            "branch_computations",
            "true_computation",
            "false_computation",
          )
          for c in _called(inst, key)
        ]
        if branches:
          cost.merge(max(branches, key=lambda b: b.total_flops), 1.0)
      elif inst.opcode == "call":
        for c in _called(inst, "to_apply"):
          cost.merge(self.walk(c, here), 1.0)
      elif inst.opcode not in _FREE and _target(inst) not in _FREE_CALLS:
        flops = _flops(inst, comp)
        if inst.opcode == "fusion":
          flops += sum(self.inner_flops(c) for c in _called(inst, "calls"))
        if _target(inst) == "tpu_custom_call":
          splash = _splash_flops(inst)
          if splash is None:
            cost.opaque_calls += 1
          flops += splash or 0.0
        cost.add(here, flops, self.moved(inst, comp))
    return cost


def program_cost(
  hlo_text: str,
  bounds: Mapping[str, int] | None = None,
  phases: tuple[str, ...] | None = None,
) -> Cost:
  """The cost of the program in ``hlo_text`` (see the module docstring);
  ``phases``: the scope names reported apart (others are ``"other"``);
  None: every first-level scope."""
  comps, entry = parse(hlo_text)
  return _Walker(comps, dict(bounds or {}), phases).walk(entry, "other")


def to_json(cost: Cost) -> str:
  return json.dumps(dataclasses.asdict(cost))
