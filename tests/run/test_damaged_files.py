"""Damaged files and faults while writing: a checkpoint cut short, missing
an item or of another model is refused naming it, and nothing is deleted;
a file written whole survives a full disk or a kill mid-write; a metrics
line cut short by a kill is dropped, a damaged one named."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax.algo.state import TrainState
from starpo_jax.run import checkpoint, files
from starpo_jax.run import metrics as metrics_lib
from tests.helpers import small_state


def _big() -> TrainState:
  """A state of 256 KiB that does not compress."""
  w = np.random.default_rng(0).normal(size=2**16).astype(np.float32)
  return small_state(0.0, 2**16).replace(
    policy=nnx.State({"w": nnx.Param(jnp.asarray(w))})
  )


def _cut_short(folder) -> None:
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.fixture
def saved(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3)
  ckpt.save(1, small_state(1.0))
  ckpt.save(2, small_state(2.0))
  ckpt.wait()
  return tmp_path


@pytest.mark.parametrize(
  "damage, size, message",
  [
    (lambda d: _cut_short(d / "2" / "state"), 3, "Error"),
    (lambda d: shutil.rmtree(d / "2" / "state"), 3, '"state" was not found'),
    (lambda d: None, 4, "shape"),  # restored onto another model's shapes
  ],
  ids=["cut_short", "missing_item", "other_model"],
)
def test_a_damaged_checkpoint_is_named_and_the_others_kept(
  saved, damage, size, message
):
  damage(saved)
  before = sorted(os.listdir(saved))
  ckpt = checkpoint.Checkpointer(str(saved), keep=3)
  with pytest.raises(checkpoint.DamagedCheckpoint) as e:
    ckpt.restore(2, small_state(0.0, size))
  text = str(e.value)
  assert text.startswith(os.path.join(str(saved), "2") + ": cannot"), text
  assert "steps: [1, 2]" in text and re.search(message, text), text
  # Nothing was deleted, and the earlier checkpoint still restores.
  assert sorted(os.listdir(saved)) == before
  restored = ckpt.restore(1, small_state(0.0))
  np.testing.assert_array_equal(restored.policy["w"].value, np.ones(3))


def test_load_policy_names_a_damaged_checkpoint(saved):
  _cut_short(saved / "2" / "state")
  with pytest.raises(checkpoint.DamagedCheckpoint, match=r"/2: cannot be"):
    checkpoint.load_policy(str(saved))
  step, policy, _ = checkpoint.load_policy(str(saved), 1)
  assert step == 1 and float(policy["w"][0]) == 1.0


# A checkpoint save in its own process, stopped partway: "rename N" kills
# it at Orbax's Nth rename (its items', then the whole checkpoint's, the
# commit), "after S" S seconds into the save, "full" gives it a disk with
# room for 64 KiB (writes beyond fail as on a full disk).
INTERRUPTED_SAVE = """
import os, resource, signal, sys, threading
from tests.run.test_damaged_files import _big
from starpo_jax.run import checkpoint
folder, how, arg = sys.argv[1:]
ckpt = checkpoint.Checkpointer(folder, keep=5)
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if how == "rename":
  rename, seen = os.rename, []
  def counted(*a, **k):
    seen.append(a)
    if len(seen) == int(arg):
      die()
    return rename(*a, **k)
  os.rename = counted
elif how == "after":
  threading.Timer(float(arg), die).start()
else:
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (2**16, 2**16))
ckpt.save(3, _big())
ckpt.wait()
ckpt.close()
"""


@pytest.mark.parametrize(
  "how, arg",
  [("rename", 1), ("rename", 3), ("after", 0.05), ("full", 0)],
  ids=["killed_writing", "killed_committing", "killed_at_50ms", "disk_full"],
)
def test_an_interrupted_save_leaves_the_last_checkpoint_and_resumes(
  saved, how, arg
):
  out = subprocess.run(
    [sys.executable, "-c", INTERRUPTED_SAVE, str(saved), how, str(arg)],
    capture_output=True,
    text=True,
  )
  if how == "rename":
    assert out.returncode == -9, out.stderr[-2000:]
  elif how == "full":
    assert out.returncode != 0 and "File too large" in out.stderr, out.stderr
  ckpt = checkpoint.Checkpointer(str(saved), keep=5)
  latest = ckpt.latest_step()
  # The save finished (the timer fired after its commit), or the last
  # checkpoint is step 2, whole.
  assert latest == (3 if out.returncode == 0 else 2), out.stderr[-2000:]
  want = _big() if latest == 3 else small_state(2.0)
  state = ckpt.restore(latest, small_state(0.0, want.policy["w"].value.size))
  np.testing.assert_array_equal(state.policy["w"].value, want.policy["w"].value)
  # The run goes on: saving after it works, and reads back.
  ckpt.save(4, small_state(4.0))
  ckpt.wait()
  assert ckpt.latest_step() == 4
  state = ckpt.restore(4, small_state(0.0))
  np.testing.assert_array_equal(state.policy["w"].value, np.full(3, 4.0))


# ---------------------------------------------------------------------------
# Files written whole


def test_a_full_disk_mid_write_keeps_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / "config.json"
  files.write_atomically(str(path), "old\n")

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError, match="No space"):
    files.write_atomically(str(path), "new\n" * 1000)
  assert path.read_text() == "old\n"
  assert os.listdir(tmp_path) == ["config.json"]  # no temporary file left


def test_a_kill_mid_write_keeps_the_old_file(tmp_path):
  """The process dies between writing the new text and the rename."""
  path = tmp_path / "summary.json"
  files.write_atomically(str(path), '{"old": 1}')
  code = textwrap.dedent(
    f"""
    import os, signal
    from starpo_jax.run import files
    os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    files.write_atomically({str(path)!r}, '{{"new": 2}}')
    """
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True)
  assert out.returncode == -9, out.stderr
  assert json.loads(path.read_text()) == {"old": 1}


# ---------------------------------------------------------------------------
# JSON lines


def _lines(path, records, tail=""):
  path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_a_metrics_line_cut_short_is_dropped_on_resume(tmp_path):
  records = [{"step": s, "loss": 0.5 * s} for s in range(1, 5)]
  _lines(tmp_path / "metrics.jsonl", records, tail='{"step": 5, "lo')
  assert metrics_lib.read_metrics(str(tmp_path)) == records
  writer = metrics_lib.MetricWriter(str(tmp_path))
  writer.truncate_after(3)
  writer.write(4, {"loss": 9.0})
  writer.close()
  got = metrics_lib.read_metrics(str(tmp_path))
  assert got == [*records[:3], {"step": 4, "loss": 9.0}]


@pytest.mark.parametrize(
  "line, message",
  [('{"step": 2, "lo', "not a JSON line"), ("[1, 2]", "not a JSON object")],
)
def test_a_damaged_metrics_line_is_named_by_file_and_line(
  tmp_path, line, message
):
  path = tmp_path / "metrics.jsonl"
  path.write_text(f'{{"step": 1}}\n{line}\n{{"step": 3}}\n')
  with pytest.raises(ValueError, match=rf"metrics.jsonl:2: {message}"):
    metrics_lib.read_metrics(str(tmp_path))
