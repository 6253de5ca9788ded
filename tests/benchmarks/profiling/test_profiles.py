"""Where a step's time goes (``benchmarks.profiling``): ``op_profile``
(the JAX step's operations from a profiler trace), ``loop_phases`` (JAX
beside the PyTorch loop, phase by phase) and ``matmul`` (both frameworks'
dense kernels), each at its smoke size."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from benchmarks.profiling import loop_phases, matmul, op_profile


@pytest.mark.parametrize(
  "op_name, part",
  [
    ("jit(collect)/while/body/prompt/prefill/cond/branch_0_fun/dot", "prefill"),
    (
      "jit(collect)/while/body/decode/while/body/forward/kv_blocks/exp",
      "decode: forward",
    ),
    (
      "jit(collect)/while/body/decode/while/body/sample/reduce",
      "decode: sample",
    ),
    (
      "jit(collect)/while/body/decode/while/body/stop/select_n",
      "decode: writes, stops",
    ),
    (
      "jit(collect)/while/body/decode/cond/branch_1_fun/gather",
      "decode: writes, stops",
    ),
    ("jit(collect)/while/body/prompt/concatenate", "render prompt"),
    ("jit(collect)/while/body/environment/vmap()/add", "environment"),
    ("jit(collect)/new_levels/vmap()/while", "new levels"),
    ("jit(collect)/transpose", "other"),
  ],
)
def test_a_rollout_operation_is_counted_in_the_part_its_scope_names(
  op_name, part
):
  assert op_profile.rollout_part(op_name) == part


def test_update_operations_split_into_forward_backward_and_the_rest():
  assert op_profile.update_part("jit(update)/update/jvp()/dot") == "forward"
  assert (
    op_profile.update_part("jit(update)/update/transpose(jvp())/dot")
    == "backward"
  )
  assert op_profile.update_part("jit(update)/update/adam/sqrt") == (
    "loss, clipping, optimizer"
  )
  assert op_profile.short(
    "jit(f)/while/body/decode/while/body/forward/dot"
  ) == ("decode/forward/dot")


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
  proc = subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.mark.slow
def test_loop_phases_smoke_times_both_sides_part_by_part(tmp_path):
  out = tmp_path / "phases.json"
  proc = _run(
    "benchmarks.profiling.loop_phases",
    "--smoke",
    "--repeats",
    "1",
    "--json",
    str(out),
  )
  result = json.loads(out.read_text())
  j, t = result["jax"], result["torch"]
  assert j["workload"] == t["workload"]
  for side in (j, t):
    for phase in ("collect", "prepare", "update", "iteration"):
      assert math.isfinite(side[phase]) and side[phase] > 0, (phase, side)
    assert {"prefill", "decode: forward", "decode: sample"} <= set(
      side["parts"]
    )
  # JAX's parts are shares of its collect; PyTorch's lie inside its own.
  assert sum(j["parts"].values()) + j["other"] == pytest.approx(j["collect"])
  assert sum(t["parts"].values()) <= t["collect"]
  # What it printed is what the docs render from its JSON.
  table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
  assert "\n".join(table) == loop_phases.table(result)


def test_matmul_smoke_measures_both_frameworks_on_every_shape(tmp_path):
  out = tmp_path / "matmul.json"
  _run(
    "benchmarks.profiling.matmul",
    "--smoke",
    "--min-seconds",
    "0.02",
    "--json",
    str(out),
  )
  rows = json.loads(out.read_text())["rows"]
  assert [r["shape"] for r in rows] == [s[0] for s in matmul.SHAPES]
  for r in rows:
    for key in ("jax_gflops", "torch_gflops"):
      assert math.isfinite(r[key]) and r[key] > 0, r
