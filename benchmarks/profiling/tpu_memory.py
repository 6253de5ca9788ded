"""Per-chip memory and compile time of the full training step for Qwen2.5
models on Cloud TPU slices, compiled ahead of time on this machine.

  python -m benchmarks.profiling.tpu_memory --json docs/data/tpu_memory.json
  python -m benchmarks.profiling.tpu_memory --row qwen2.5-7b,v5p-8,1,4,1 \
    --config.algo.micro_batch_tokens=16384

Each row runs ``starpo_jax.compile_check`` in its own process (one TPU
topology per process) on the Sokoban config at RAGEN's settings: 128
episodes (8 levels x 16), 5 turns, 100 new tokens a turn, 2,048 tokens of
context, bfloat16, StarPO-S (the policy, a critic of the same size, no
reference model). Nothing is allocated: ``libtpu`` (``pip install
'jax[tpu]'``) compiles for chips this machine does not have, and the
compiled program's memory analysis gives the bytes live at its peak, and
its FLOPs and bytes (loops counted as they run, ``starpo_jax.hlo_cost``)
a roofline lower bound of the step at the chip's published peaks: an
estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

GiB = 1024**3

# (model, slice, mesh data,fsdp,tensor): the mesh each needs to fit.
ROWS = (
  ("qwen2.5-0.5b", "v5e-8", "1,8,1"),
  ("qwen2.5-1.5b", "v5e-8", "1,8,1"),
  ("qwen2.5-3b", "v5e-8", "1,8,1"),
  ("qwen2.5-7b", "v5e-8", "1,8,1"),
  ("qwen2.5-0.5b", "v6e-8", "1,8,1"),
  ("qwen2.5-1.5b", "v6e-8", "1,8,1"),
  ("qwen2.5-3b", "v6e-8", "1,8,1"),
  ("qwen2.5-7b", "v6e-8", "1,8,1"),
  ("qwen2.5-0.5b", "v5p-8", "1,4,1"),
  ("qwen2.5-1.5b", "v5p-8", "1,4,1"),
  ("qwen2.5-3b", "v5p-8", "1,4,1"),
  ("qwen2.5-7b", "v5p-8", "1,4,1"),
)


def compile_row(
  model: str, slice_name: str, mesh: str, overrides: list[str]
) -> dict:
  """One ``compile_check`` run in a subprocess; its JSON report."""
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "report.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    cmd = [
      sys.executable,
      "-m",
      "starpo_jax.compile_check",
      f"--config=configs/sokoban.py:model={model}",
      f"--topology={slice_name}",
      f"--mesh={mesh}",
      f"--json={report}",
      *overrides,
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
      tail = out.stderr.strip().splitlines()[-3:]
      if out.returncode < 0:
        # Killed: SIGKILL is most often the kernel out of host memory.
        tail.append(f"killed by signal {-out.returncode}")
      row = {"model": model, "slice": slice_name, "error": " | ".join(tail)}
    else:
      with open(report) as f:
        (row,) = json.load(f)
  row["slice"] = slice_name
  # The settings the row changed from RAGEN's (LoRA, micro-batches).
  row["overrides"] = list(overrides)
  return row


def _label(r: dict) -> str:
  """The model and what the row changed from RAGEN's settings."""
  settings = dict(
    o.removeprefix("--config.").split("=", 1) for o in r.get("overrides") or []
  )
  lora = r.get("lora") or {}
  rank = settings.get("model.lora.rank", lora.get("rank"))
  label = r["model"]
  if rank is not None:
    kind = "QLoRA" if "model.lora.quantize" in settings else "LoRA"
    label += f", {kind} r={rank}"
    if kind == "QLoRA":
      label += (
        f" ({settings['model.lora.quantize']} base, tiles of "
        f"{settings.get('model.lora.tile_size', '-')})"
      )
    if lora.get("critic") == "full":
      label += ", whole critic (`lora.critic=full`)"
  if "algo.micro_batch_tokens" in settings:
    label += (
      f", micro-batches of {int(settings['algo.micro_batch_tokens']):,} tokens"
    )
  return label


OUT_OF_HBM = re.compile(
  r"HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)"
)


def table(rows: list[dict]) -> str:
  """One line per row; a failed compile says why (out of HBM: by how much)."""
  lines = [
    "| model | slice | mesh (data, fsdp, tensor) | collapse diagnostics | "
    "params + optimizer | activations | peak / chip | chip HBM | fits | "
    "compile | step roofline bound (estimate) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    mesh = ", ".join(str(v) for v in r["mesh"].values()) if "mesh" in r else "-"
    # Rows written before the setting was recorded ran with its default.
    diagnostics = "off" if r.get("collapse_diagnostics") is False else "on"
    head = f"| {_label(r)} | {r['slice']} | {mesh} | {diagnostics} |"
    if "error" in r:
      hbm = OUT_OF_HBM.search(r["error"])
      if hbm:
        lines.append(
          f"{head} | XLA's temporaries alone {hbm[1]} GiB | | "
          f"{hbm[2]} GiB usable | **no** (out of HBM) | | |"
        )
      else:
        lines.append(f"{head} failed: {r['error']} |")
      continue
    fits = (
      "yes"
      if r["peak_bytes"] <= r["hbm_bytes"]
      else (f"**no** (by {(r['peak_bytes'] - r['hbm_bytes']) / GiB:.2f} GiB)")
    )
    # Rows compiled before compile_check counted FLOPs have no estimate.
    bound = r.get("roofline_s")
    bound = "-" if bound is None else f"{bound:.2f} s"
    lines.append(
      f"{head} {(r['param_bytes'] + r['optimizer_bytes']) / GiB:.2f} GiB | "
      f"{r['activation_bytes'] / GiB:.2f} GiB | "
      f"{r['peak_bytes'] / GiB:.2f} GiB | {r['hbm_bytes'] / GiB:.0f} GiB | "
      f"{fits} | {r['compile_s']:.0f} s | {bound} |"
    )
  return "\n".join(lines)


def _bound(flops: float, nbytes: float, r: dict) -> str:
  """A phase's roofline time: its FLOPs at peak or bytes at bandwidth."""
  by_flops, by_bytes = flops / r["peak_flops"], nbytes / r["peak_bandwidth"]
  if by_bytes >= by_flops:
    return (
      f"{by_bytes:.2f} s: {nbytes / 1e9:,.0f} GB ({flops / 1e12:,.1f} TFLOP)"
    )
  return f"{by_flops:.2f} s: {flops / 1e12:,.1f} TFLOP ({nbytes / 1e9:,.0f} GB)"


def phase_table(rows: list[dict]) -> str:
  """Where each row's roofline estimate goes, phase by phase, per chip
  (the rows with RAGEN's settings unchanged and FLOPs counted)."""
  lines = [
    "| model, slice | rollout (`collect`) | score | update | XLA's own count |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    if "phase_flops" not in r or r.get("overrides") or r.get("lora"):
      continue
    f, b = r["phase_flops"], r["phase_bytes"]
    score = max(f["score"] / r["peak_flops"], b["score"] / r["peak_bandwidth"])
    collect = _bound(f["collect"], b["collect"], r)
    lines.append(
      f"| {r['model']}, {r['slice']} | {collect} | "
      f"{score:.2f} s | {_bound(f['update'], b['update'], r)} | "
      f"{r['xla_flops'] / 1e12:,.0f} TFLOP |"
    )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--row",
    action="append",
    default=[],
    help="model,slice,data,fsdp,tensor (repeatable); default: the table",
  )
  parser.add_argument("--json", default=None, help="write the rows here")
  args, overrides = parser.parse_known_args(argv)
  for item in overrides:
    if not item.startswith("--config."):
      parser.error(f"unexpected argument {item!r} (rows take --config.x=y)")
  rows = ROWS
  if args.row:
    rows = []
    for text in args.row:
      parts = text.split(",")
      if len(parts) != 5:
        parser.error(f"--row={text!r}: want model,slice,data,fsdp,tensor")
      rows.append((parts[0], parts[1], ",".join(parts[2:])))
  results = []
  for model, slice_name, mesh in rows:
    results.append(compile_row(model, slice_name, mesh, overrides))
    print(table(results[-1:]).splitlines()[-1], flush=True)
  print(table(results))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return results


if __name__ == "__main__":
  main()
