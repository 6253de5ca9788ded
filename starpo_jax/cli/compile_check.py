"""Ahead-of-time check: compile the train step for a mesh, print memory.

Sizes a run before renting hardware: lowers and compiles the whole step
(rollout and update) for the configured mesh on simulated CPU devices, or
for a named TPU topology where the installed JAX can (it needs ``libtpu``),
and prints per-device parameter, optimizer and activation memory. Nothing is
allocated: parameters are abstract, so a 7B model checks on a laptop.

It also prints, per phase of the step, the FLOPs and bytes of the compiled
program with its loops counted as they run (``hlo_cost``; the decode loop
at its ``max_new_tokens`` bound) and, for a TPU, a roofline lower bound of
the step time at the chip's published peaks: an estimate, not a
measurement.

  python -m starpo_jax.compile_check \\
    --config=configs/sokoban.py:model=qwen2.5-3b --mesh=2,4,1
  python -m starpo_jax.compile_check --config=configs/bandit.py \\
    --mesh=1,1,1 --mesh=1,2,1 --mesh=1,4,1 --json=report.json
  python -m starpo_jax.compile_check \\
    --config=configs/sokoban.py:model=qwen2.5-7b --topology=v5e:4x4 --mesh=2,8,1
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

# Imports nothing from jax: the device count is set before jax loads.
from starpo_jax.cli import app as cli_app

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Training configuration file.", lock_config=True
)
_MESH = flags.DEFINE_multi_string(
  "mesh", [], "data,fsdp,tensor (repeat to compare meshes); default: config"
)
_TOPOLOGY = flags.DEFINE_string(
  "topology",
  None,
  "A TPU topology such as v5e:2x4, or a slice name such as v5e-8 "
  "(needs libtpu: pip install 'jax[tpu]').",
)
_JSON = flags.DEFINE_string("json", None, "Also write the report here.")
_HLO = flags.DEFINE_string(
  "hlo",
  None,
  "Also write each compiled step's optimized HLO text here (the mesh, "
  "as data-fsdp-tensor, is added to the name when --mesh is repeated).",
)

GiB = 1024**3

# Cloud TPU slice names -> JAX topology names (chips x chips [x chips]).
# A v5p or v4 slice is named by TensorCores, two per chip.
SLICES = {
  "v4-8": "v4:2x2x1",
  "v4-16": "v4:2x2x2",
  "v5e-1": "v5e:1x1",
  "v5e-4": "v5e:2x2",
  "v5e-8": "v5e:2x4",
  "v5e-16": "v5e:4x4",
  "v5p-8": "v5p:2x2x1",
  "v5p-16": "v5p:2x2x2",
  "v5p-32": "v5p:2x2x4",
  "v6e-1": "v6e:1x1",
  "v6e-4": "v6e:2x2",
  "v6e-8": "v6e:2x4",
  "v6e-16": "v6e:4x4",
}

# High-bandwidth memory per chip, by the device kind JAX reports.
HBM = {
  "TPU v4": 32 * GiB,
  "TPU v5 lite": 16 * GiB,
  "TPU v5e": 16 * GiB,
  "TPU v5": 95 * GiB,
  "TPU v5p": 95 * GiB,
  "TPU v6 lite": 32 * GiB,
  "TPU v6e": 32 * GiB,
}

# Published peaks per chip, by device kind: dense bfloat16 FLOP/s and HBM
# bytes/s (Google Cloud's TPU pages).
PEAKS = {
  "TPU v4": (275e12, 1228e9),
  "TPU v5 lite": (197e12, 819e9),
  "TPU v5e": (197e12, 819e9),
  "TPU v5": (459e12, 2765e9),
  "TPU v5p": (459e12, 2765e9),
  "TPU v6 lite": (918e12, 1640e9),
  "TPU v6e": (918e12, 1640e9),
}
# The step's named scopes, reported apart; "diagnostics" runs only every
# few steps (counted apart from the step's bound).
PHASES = (
  "collect",
  "score",
  "select",
  "advantages",
  "update",
  "metrics",
  "diagnostics",
)


def _parse_mesh(text: str) -> tuple[int, ...]:
  try:
    shape = tuple(int(d) for d in text.split(","))
  except ValueError:
    raise app.UsageError(f"--mesh={text!r}: want data,fsdp,tensor") from None
  if len(shape) != 3 or any(d < 1 for d in shape):
    raise app.UsageError(f"--mesh={text!r}: want three positive sizes")
  return shape


def _simulate(devices: int) -> None:
  """Restarts this command with ``devices`` simulated CPU devices (XLA
  reads the count once, when JAX starts)."""
  flag = f"--xla_force_host_platform_device_count={devices}"
  if flag in os.environ.get("XLA_FLAGS", ""):
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
  argv = [sys.executable, "-m", "starpo_jax.compile_check", *sys.argv[1:]]
  os.execve(sys.executable, argv, env)


def _host_bounds(name: str) -> list[int]:
  """Chips per host along each axis: libtpu's default 2x2x1, or the slice
  itself where it is smaller (one v5e chip, ``v5e:1x1``)."""
  dims = [int(d) for d in name.split(":")[-1].split("x") if d.isdigit()]
  dims += [1] * (3 - len(dims))
  return [min(d, b) for d, b in zip(dims, (2, 2, 1), strict=False)]


def _devices(count: int):
  import jax

  if _TOPOLOGY.value is None:
    return jax.devices()[:count]
  from jax.experimental import topologies

  # Compiling touches no chip: libtpu need not be the only one loaded
  # (a training run or another check may hold its lock file).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  name = SLICES.get(_TOPOLOGY.value, _TOPOLOGY.value)
  try:
    topology = topologies.get_topology_desc(
      platform="tpu",
      topology_name=name,
      chips_per_host_bounds=_host_bounds(name),
    )
  except Exception as e:  # what is missing depends on the installation
    raise app.UsageError(
      f"--topology={_TOPOLOGY.value}: this JAX cannot compile for TPU "
      f"topologies here ({type(e).__name__}: {e}); install jax[tpu]"
    ) from None
  if len(topology.devices) != count:
    raise app.UsageError(
      f"--topology={_TOPOLOGY.value} has {len(topology.devices)} chips; "
      f"the mesh needs {count}"
    )
  return topology.devices


def check(
  config, shape: tuple[int, ...], devices, hlo: str | None = None
) -> dict:
  """Compiles the step for one mesh; returns its per-device memory. With
  ``hlo``, also writes the compiled program's text there."""
  import jax

  from starpo_jax import sharding
  from starpo_jax.models import attention
  from starpo_jax.run import assembly

  config = dataclasses.replace(
    config, mesh=dataclasses.replace(config.mesh, shape=shape)
  )
  setup = assembly.build(config, shapes_only=True, devices=devices)
  learner = assembly.make_learner(setup)
  state = assembly.abstract_state(setup, learner)
  step = assembly.compile_step(setup, state, learner)
  t0 = time.perf_counter()
  lowered = step.lower(state, setup.codec)
  compiled = lowered.compile()
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  if hlo:
    with open(hlo, "w") as f:
      f.write(compiled.as_text())
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(state.policy))
  field = lambda name: int(getattr(mem, name, 0) or 0)
  kind = devices[0].device_kind
  m = setup.model_cfg
  return {
    "mesh": dict(zip(sharding.AXES, shape, strict=True)),
    "devices": math.prod(shape),
    "platform": devices[0].platform,
    "device_kind": kind,
    "model": config.model.preset,
    "dtype": m.dtype,
    "remat": m.remat,
    "attention": attention.choose(m.attention, m.dtype, devices[0].platform),
    # Pallas/Mosaic kernels in the program (splash attention on TPU).
    "tpu_kernels": lowered.as_text().count("tpu_custom_call"),
    "policy_parameters": count,
    "compile_s": seconds,
    **_state_bytes(state),
    "activation_bytes": field("temp_size_in_bytes"),
    "argument_bytes": field("argument_size_in_bytes"),
    # Live at the peak: the arguments (the state, donated), outputs that
    # do not reuse an argument's buffer, and XLA's temporaries.
    "peak_bytes": field("argument_size_in_bytes")
    + field("output_size_in_bytes")
    - field("alias_size_in_bytes")
    + field("temp_size_in_bytes"),
    "hbm_bytes": HBM.get(kind),
    "code_bytes": field("generated_code_size_in_bytes"),
    **_work(compiled, setup.config.rollout, kind),
  }


def _state_bytes(state) -> dict[str, int]:
  """The train state's bytes on one device: parameters (policy, critic,
  reference) and optimizer moments."""
  from starpo_jax import sharding

  per_device = lambda trees: sum(
    sharding.bytes_per_device(t) for t in trees if t is not None
  )
  return {
    "param_bytes": per_device((state.policy, state.critic, state.reference)),
    "optimizer_bytes": per_device((state.policy_opt, state.critic_opt)),
  }


def _work(compiled, rollout_cfg, kind: str) -> dict:
  """The compiled step's FLOPs and bytes per phase (``hlo_cost``), XLA's
  own count, and the roofline bound at ``kind``'s published peaks where
  every loop of the step could be counted."""
  from starpo_jax.cli import hlo_cost
  from starpo_jax.models import attention

  cost = hlo_cost.program_cost(
    compiled.as_text(),
    bounds={
      "decode": rollout_cfg.max_new_tokens,
      "kv_blocks": -(-rollout_cfg.max_context // attention.ATTENTION_BLOCK),
    },
    phases=PHASES,
  )
  per_step = [p for p in PHASES if p != "diagnostics"] + ["other"]
  # Loops of the step counted once, other than the level generators'
  # rejection loops (cheap, data-dependent by nature) and the periodic
  # diagnostics (outside the bound): with them the bound means nothing.
  blind = sorted(
    {
      n
      for n in cost.unbounded_loops
      if "(generate)" not in n and "/diagnostics/" not in n
    }
  )
  peaks = PEAKS.get(kind) if not blind else None
  return {
    "phase_flops": cost.flops,
    "phase_bytes": cost.bytes,
    # XLA's own count, which takes each loop body once.
    "xla_flops": float((compiled.cost_analysis() or {}).get("flops", 0.0)),
    "unbounded_loops": sorted(set(cost.unbounded_loops)),
    "blind_loops": blind,
    "opaque_calls": cost.opaque_calls,
    "peak_flops": peaks[0] if peaks else None,
    "peak_bandwidth": peaks[1] if peaks else None,
    "roofline_s": (
      hlo_cost.Cost(
        {p: cost.flops.get(p, 0.0) for p in per_step},
        {p: cost.bytes.get(p, 0.0) for p in per_step},
      ).roofline_seconds(*peaks)
      if peaks
      else None
    ),
  }


def _size(n: float) -> str:
  for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
    if n >= scale:
      return f"{n / scale:8.2f} {unit}"
  return f"{n:8.0f} B  "


def report(r: dict) -> str:
  mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
  total = r["param_bytes"] + r["optimizer_bytes"] + r["activation_bytes"]
  n = r["policy_parameters"]
  count = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
  lines = [
    f"{r['model']} ({count} policy parameters, {r['dtype']}, remat "
    f"{r['remat']}, {r['attention']} attention) on mesh {mesh}: "
    f"{r['devices']} {r['platform']} devices ({r['device_kind']}); "
    f"compiled in {r['compile_s']:.0f} s",
    "  per device:",
    f"    parameters   {_size(r['param_bytes'])} (policy, critic, reference)",
    f"    optimizer    {_size(r['optimizer_bytes'])} (AdamW moments)",
    f"    activations  {_size(r['activation_bytes'])}"
    " (XLA temporaries: KV cache, logits, gradients)",
    f"    total        {_size(total)}",
    f"    peak         {_size(r['peak_bytes'])} (live at once, as compiled)",
  ]
  if r["hbm_bytes"]:
    fits = "fits" if r["peak_bytes"] <= r["hbm_bytes"] else "DOES NOT FIT"
    lines.append(f"    chip memory  {_size(r['hbm_bytes'])}: {fits}")
  lines.append(
    "  per device and step, loops counted as they run (decode at its "
    "bound), GB read and written in device memory:"
  )
  for phase in (*PHASES, "other"):
    f, b = r["phase_flops"].get(phase, 0.0), r["phase_bytes"].get(phase, 0.0)
    if f or b:
      note = " (every collapse_every steps)" if phase == "diagnostics" else ""
      lines.append(
        f"    {phase:<12} {f / 1e9:12.2f} GFLOP {b / 1e9:10.2f} GB{note}"
      )
  lines.append(
    f"    (XLA's cost_analysis, each loop body once: "
    f"{r['xla_flops'] / 1e9:.2f} GFLOP)"
  )
  if r["unbounded_loops"]:
    lines.append(
      f"    counted once (no trip count, no bound): {len(r['unbounded_loops'])}"
      " loops, e.g. " + r["unbounded_loops"][0]
    )
  if r["opaque_calls"]:
    lines.append(
      f"    {r['opaque_calls']} kernel calls whose FLOPs XLA cannot see "
      "(their bytes are counted)"
    )
  if r["blind_loops"]:
    lines.append(
      f"    no roofline estimate: {len(r['blind_loops'])} loops of the step "
      "have no trip count (counted once), e.g. " + r["blind_loops"][0]
    )
  elif r["roofline_s"] is not None:
    lines.append(
      f"    roofline lower bound of the step (estimate): "
      f"{r['roofline_s']:.3f} s at {r['peak_flops'] / 1e12:.0f} TFLOP/s, "
      f"{r['peak_bandwidth'] / 1e9:.0f} GB/s a chip (collectives not "
      "counted)"
    )
  return "\n".join(lines)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from starpo_jax.run import assembly

  config = assembly.parse(_CONFIG.value)
  shapes = [_parse_mesh(m) for m in _MESH.value]
  if not shapes:
    if -1 in tuple(config.mesh.shape):
      raise app.UsageError(
        f"config.mesh.shape={tuple(config.mesh.shape)} has a -1: give "
        "--mesh=data,fsdp,tensor"
      )
    shapes = [tuple(config.mesh.shape)]
  largest = max(math.prod(s) for s in shapes)
  if _TOPOLOGY.value is None:
    _simulate(largest)
  results = []
  for shape in shapes:
    devices = _devices(math.prod(shape))
    hlo = _HLO.value
    if hlo and len(shapes) > 1:
      root, ext = os.path.splitext(hlo)
      hlo = f"{root}.{'-'.join(map(str, shape))}{ext}"
    results.append(check(config, shape, devices, hlo))
    print(report(results[-1]), flush=True)
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(results, f, indent=1)


def entry() -> None:
  """``starpo-compile-check`` and ``python -m starpo_jax.compile_check``."""
  cli_app.run(main, required=["config"], doc=__doc__)


if __name__ == "__main__":
  entry()
