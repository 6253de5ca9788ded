"""Train an agent: ``python -m starpo_jax.main --config=configs/sokoban.py``.

Flags:
  --config    an ml_collections config file, optionally with arguments
              (``configs/sokoban.py:model=qwen2.5-0.5b,ckpt=PATH``); any
              field can be overridden (``--config.rollout.group_size=16``).
  --workdir   where checkpoints, metrics and transcripts go; running the
              same command again resumes from the latest checkpoint.
              Defaults to ``runs/<environment>``.
  --distributed
              join a multi-host run (``jax.distributed.initialize()``)
              before anything else; on Cloud TPU and under SLURM the
              coordinator and process ids are found automatically, elsewhere
              pass --coordinator_address, --num_processes and --process_id.

A SIGTERM (a spot VM's notice) or Ctrl-C stops the run after the step in
progress, with a checkpoint, and exits with status 75 (EX_TEMPFAIL): the
same command resumes it.
"""

from __future__ import annotations

import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from starpo_jax.cli import app as cli_app
from starpo_jax.run import assembly, preemption, train

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Training configuration file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed", False, "Call jax.distributed.initialize() first."
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0 (--distributed)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Processes in the run (--distributed)."
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "This process's index (--distributed)."
)


def initialize_distributed() -> None:
  """Joins the multi-host run when --distributed is given."""
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if not _DISTRIBUTED.value:
    if any(v is not None for v in explicit):
      raise app.UsageError(
        "--coordinator_address, --num_processes and --process_id need "
        "--distributed"
      )
    return
  jax.distributed.initialize(
    coordinator_address=_COORDINATOR.value,
    num_processes=_NUM_PROCESSES.value,
    process_id=_PROCESS_ID.value,
  )


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Checkpointing libraries log every save at INFO.
  logging.set_verbosity(logging.WARNING)
  initialize_distributed()
  config = assembly.parse(_CONFIG.value)
  workdir = _WORKDIR.value or os.path.join("runs", config.env.name)
  summary = train.run(config, workdir)
  if summary["preempted"]:
    sys.exit(preemption.EXIT_STATUS)


def entry() -> None:
  """``starpo-train`` and ``python -m starpo_jax.main``."""
  cli_app.run(main, required=["config"], doc=__doc__)


if __name__ == "__main__":
  entry()
