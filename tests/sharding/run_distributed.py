"""One process of a two-process CPU run joined by ``jax.distributed``:
trains two steps and prints the final metrics as JSON
(tests/test_sharding). With ``single`` for the port, the same run in one
process (give it two devices: ``--xla_force_host_platform_device_count=2``),
the reference the two processes must reproduce.

  python -m tests.sharding.run_distributed PORT PROCESS_ID WORKDIR [STEPS [ENV]]
  python -m tests.sharding.run_distributed single 0 WORKDIR

STEPS (default 2) lets a test stop the pair early with a SIGTERM. ENV
``gym_sokoban`` trains on the Python Sokoban instead of the bandit; the
JSON then says which episode slots this process stepped.
"""

from __future__ import annotations

import json
import sys

import jax


def main() -> None:
  port, process_id, workdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
  env_name = sys.argv[5] if len(sys.argv) > 5 else "bandit"
  if port != "single":
    jax.distributed.initialize(
      coordinator_address=f"localhost:{port}",
      num_processes=2,
      process_id=process_id,
    )
  import ml_collections

  from configs import bandit, gym_sokoban
  from envs.batch import slots as host_slots
  from starpo_jax.run import train

  # Which slots this process's host environments were asked to step.
  slots: set[int] = set()
  act = host_slots.Slots.act

  def recording(self, offset, actions, *args):
    slots.update(offset + i for i in range(len(actions)))
    return act(self, offset, actions, *args)

  host_slots.Slots.act = recording
  if env_name == "gym_sokoban":
    c = gym_sokoban.get_config("levels=sokoban")
    c.rollout.max_turns = 2
    c.rollout.max_context = 192
  else:
    c = bandit.get_config("")
  # One evaluation env at one temperature: the multi-host path, compiled
  # once rather than four times.
  c.env.eval_kwargs = ml_collections.ConfigDict()
  c.train.eval_temperatures = (0.5,)
  c.model.num_layers = 1
  c.rollout.env_groups = 4
  c.rollout.group_size = 2
  c.algo.minibatches = 1
  c.sft.steps = 0
  c.train.steps = steps
  c.train.eval_every = 2
  c.train.eval_episodes = 4
  c.train.checkpoint_every = 1
  if env_name == "gym_sokoban":
    c.train.eval_every = 0  # the slots stepped are the training batch's
  summary = train.run(c, workdir)
  print(
    json.dumps(
      {
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "steps": summary["steps"],
        "preempted": summary["preempted"],
        "slots": sorted(slots),
        "metrics": {
          k: v for k, v in summary["final"].items() if not k.startswith("time/")
        },
      }
    )
  )


if __name__ == "__main__":
  main()
