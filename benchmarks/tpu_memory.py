"""Per-chip memory and compile time of the full training step for Qwen2.5
models on Cloud TPU slices, compiled ahead of time on this machine.

  python -m benchmarks.tpu_memory --json docs/tpu_memory.json
  python -m benchmarks.tpu_memory --row qwen2.5-7b,v5p-8,1,4,1 \
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


def table(rows: list[dict]) -> str:
  lines = [
    "| model | slice | mesh (data, fsdp, tensor) | params + optimizer | "
    "activations | peak / chip | chip HBM | fits | compile | "
    "step roofline bound (estimate) |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | {r['slice']} | failed: {r['error']} |")
      continue
    mesh = ", ".join(str(v) for v in r["mesh"].values())
    fits = "yes" if r["peak_bytes"] <= r["hbm_bytes"] else "**no**"
    # Rows compiled before compile_check counted FLOPs have no estimate.
    bound = r.get("roofline_s")
    bound = "-" if bound is None else f"{bound:.2f} s"
    lines.append(
      f"| {r['model']} | {r['slice']} | {mesh} | "
      f"{(r['param_bytes'] + r['optimizer_bytes']) / GiB:.2f} GiB | "
      f"{r['activation_bytes'] / GiB:.2f} GiB | "
      f"{r['peak_bytes'] / GiB:.2f} GiB | {r['hbm_bytes'] / GiB:.0f} GiB | "
      f"{fits} | {r['compile_s']:.0f} s | {bound} |"
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
