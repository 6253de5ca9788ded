"""Stopping a run cleanly when it is asked to: a spot or preemptible VM's
notice (SIGTERM) or Ctrl-C (SIGINT).

The signal only raises a flag; the training loop finishes the step it is
in, saves a checkpoint at that step and returns, so a preempted run loses
no finished step and the same command resumes it (``starpo_jax.main``
then exits with status 75, EX_TEMPFAIL: stopped early, resumable). A
second Ctrl-C stops at once (``KeyboardInterrupt``; the run resumes from
its last checkpoint).

On several processes (``jax.distributed``) every process must save the
same step: JAX's preemption service carries a SIGTERM to all of them and
names the step they stop at (``multihost_utils.reached_preemption_sync_point``,
called once a step by every process). The service owns SIGTERM there and
no handler of ours is installed: a Ctrl-C there is a crash, resumed from
the last checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import jax
from jax.experimental import multihost_utils

# What ``starpo_jax.main`` exits with when a signal stopped the run early
# (sysexits' EX_TEMPFAIL: try again, the run resumes).
EXIT_STATUS = 75


class Preemption:
  """Signal handlers for the life of a run; ``requested(step)`` says, after
  each step, whether to stop there. ``close()`` puts the previous
  handlers back."""

  def __init__(self) -> None:
    self.signal: str | None = None
    self._previous: dict[int, object] = {}
    self._distributed = jax.process_count() > 1
    if self._distributed:
      return
    if threading.current_thread() is not threading.main_thread():
      return  # Python delivers signals to the main thread only
    for s in (signal.SIGTERM, signal.SIGINT):
      self._previous[s] = signal.signal(s, self._handle)

  def _handle(self, signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT and self.signal == "SIGINT":
      raise KeyboardInterrupt
    self.signal = signal.Signals(signum).name
    print(
      f"{self.signal}: stopping after the step in progress, with a "
      "checkpoint (Ctrl-C again stops at once)",
      file=sys.stderr,
      flush=True,
    )

  def requested(self, step: int) -> bool:
    """Whether the run stops after ``step``: a signal to this process, or,
    on several processes, JAX's preemption sync point (the same step on
    every process)."""
    if self._distributed and multihost_utils.reached_preemption_sync_point(
      step
    ):
      self.signal = "SIGTERM"
    return self.signal is not None

  def close(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
