"""Metric writers (TensorBoard, JSONL), a one-line progress display and
the profiler trace of chosen steps."""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Any

import jax

from starpo_jax.run import files


def _without_torch() -> type:
  """tensorboardX's ``SummaryWriter``, imported with PyTorch hidden:
  tensorboardX imports torch at import time where it is installed (only
  to accept torch tensors, which nothing here logs), seconds of every
  run's start on a CPU. torch imports normally after."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
  else:
    sys.modules["torch"] = None  # `import torch` raises ImportError
    try:
      from tensorboardX import SummaryWriter
    finally:
      del sys.modules["torch"]
  return SummaryWriter


SummaryWriter = _without_torch()


class MetricWriter:
  """Writes scalars to ``metrics.jsonl`` and TensorBoard event files.

  Only process 0 of a multi-host run writes (``enabled``).
  """

  def __init__(self, workdir: str, enabled: bool = True) -> None:
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = (
      SummaryWriter(os.path.join(workdir, "tensorboard")) if (enabled) else None
    )

  def truncate_after(self, step: int) -> None:
    """Drops records of steps after ``step`` (a resumed run redoes them)."""
    if not self.enabled or not os.path.exists(self.path):
      return
    kept = [r for r in files.read_json_lines(self.path) if r["step"] <= step]
    text = "".join(json.dumps(r) + "\n" for r in kept)
    files.write_atomically(self.path, text)

  def write(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, **metrics}) + "\n")
    for name, value in metrics.items():
      self._tb.add_scalar(name, value, step)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """``workdir``'s logged steps (a last line a kill cut short dropped).

  Raises:
    ValueError: naming the file and line of a damaged record.
  """
  return files.read_json_lines(os.path.join(workdir, "metrics.jsonl"))


class Progress:
  """``step 12/300 [####-----] reward 0.31 success 12% 3.1 s/step``; the
  rate is over the last ``window`` logged steps, so it follows a change of
  phase (the warm start's steps are faster than RL's) within a window."""

  def __init__(
    self, total: int, enabled: bool = True, width: int = 24, window: int = 10
  ):
    self.total, self.enabled, self.width = total, enabled, width
    self.tty = sys.stderr.isatty()
    # (step, time) of the last window + 1 updates.
    self.marks: collections.deque = collections.deque(maxlen=window + 1)

  def update(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    self.marks.append((step, time.perf_counter()))
    done = int(self.width * step / max(self.total, 1))
    bar = "#" * done + "-" * (self.width - done)
    rate = ""
    (first, t_first), (last, t_last) = self.marks[0], self.marks[-1]
    if last > first:
      rate = f" {(t_last - t_first) / (last - first):.1f} s/step"
    if "sft/next_obs_exact" in metrics:
      what = (
        f"warm start: world-model loss {metrics['sft/loss']:.3f}, next "
        f"observation exact {100 * metrics['sft/next_obs_exact']:.0f}%"
      )
    elif "sft/loss" in metrics:
      what = (
        f"warm start: imitation loss {metrics['sft/loss']:.3f} "
        f"(token prob {metrics['sft/token_prob']:.2f})"
      )
    else:
      what = (
        f"reward {metrics.get('rollout/return', float('nan')):.2f} "
        f"success {100 * metrics.get('rollout/success', 0.0):.0f}%"
      )
    line = f"step {step}/{self.total} [{bar}] {what}{rate}"
    if "eval/success" in metrics:
      line += f" | eval success {100 * metrics['eval/success']:.0f}%"
    end = "\r" if self.tty else "\n"
    print(line, end=end, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.enabled and self.tty:
      print(file=sys.stderr)


def profile_range(spec: str) -> tuple[int, int] | None:
  """``"START:STOP"`` -> ``(START, STOP)``; ``""`` -> None.

  Raises:
    ValueError: naming ``train.profile`` unless ``1 <= START < STOP``.
  """
  if not spec:
    return None
  parts = spec.split(":")
  try:
    start, stop = (int(x) for x in parts)
  except ValueError:
    start = stop = 0
  if len(parts) != 2 or not 1 <= start < stop:
    raise ValueError(
      f"train.profile={spec!r}: expected START:STOP, step numbers as "
      "logged with 1 <= START < STOP (e.g. 5:8 traces steps 5, 6 and 7)"
    )
  return start, stop


class Profile:
  """A ``jax.profiler`` trace of the steps numbered ``START`` to
  ``STOP - 1`` (as the log numbers them, warm-start steps included) in
  ``workdir/profile``, for TensorBoard's profile plugin or Perfetto. The
  step's phases appear under their names (``collect``, ``score``,
  ``select``, ``advantages``, ``update``, ``metrics``)."""

  def __init__(self, spec: str, workdir: str, enabled: bool = True) -> None:
    self.range = profile_range(spec) if enabled else None
    self.dir = os.path.join(workdir, "profile")
    self.active = False

  def before(self, step: int) -> None:
    """Called before the step numbered ``step`` runs."""
    if self.range and step == self.range[0]:
      jax.profiler.start_trace(self.dir)
      self.active = True

  def after(self, step: int, outputs: Any) -> None:
    """Called once the step numbered ``step`` was dispatched."""
    if self.active and step >= self.range[1] - 1:
      self.stop(outputs)

  def stop(self, outputs: Any = None) -> None:
    if not self.active:
      return
    jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    self.active = False
    print(f"profile of steps {self.range[0]}-{self.range[1] - 1}: {self.dir}")
