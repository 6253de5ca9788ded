"""gym_sokoban's rollout on one device and on a 2 x 2 x 2 mesh of 8
simulated CPU devices (tests/test_sharding): prints, as JSON, the host
calls each made (slot offset, rows) and whether the trajectories are
equal.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
    python -m tests.sharding.run_host_meshes
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np

import envs
from starpo_jax import sharding
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo.sft import ScriptedPolicy
from tests.test_host import CFG, script_from
from tests.text_fixtures import TOKENIZERS


def main() -> None:
  tok = TOKENIZERS["bpe"]()
  cfg = dataclasses.replace(CFG, env_groups=4, group_size=4, max_turns=3)
  rng = np.random.default_rng(0)
  names = ("Up", "Down", "Left", "Right")
  replies = [
    [
      "<answer>"
      + " || ".join(names[a] for a in rng.integers(0, 4, 2))
      + "</answer>"
      for _ in range(cfg.max_turns)
    ]
    for _ in range(cfg.batch)
  ]
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  out, calls = {}, {}
  for shape in ((1, 1, 1), (2, 2, 2)):
    env = envs.make("gym_sokoban", levels="sokoban").with_tokenizer(
      tok.encode, sharding.BATCH
    )
    seen = calls[str(shape)] = []
    act = env.slots.act

    def recording(offset, actions, *args, act=act, seen=seen):
      seen.append([offset, len(actions)])
      return act(offset, actions, *args)

    env.slots.act = recording
    codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
    mesh = sharding.make_mesh(shape, jax.devices()[: int(np.prod(shape))])
    play = sharding.traced_for(
      mesh,
      lambda p, c, k, env=env, mesh=mesh: rollout.rollout(
        p, c, env, cfg, k, sharding.batch_constraint(mesh, cfg.batch)
      ),
    )
    traj = jax.jit(play)(policy, codec, jax.random.key(3))
    out[shape] = jax.tree.map(np.asarray, traj)
  a, b = out[(1, 1, 1)], out[(2, 2, 2)]
  equal = all(
    np.array_equal(getattr(a, f), getattr(b, f))
    for f in ("tokens", "turn_rewards", "success", "num_actions")
  )
  print(
    json.dumps({"calls": calls, "equal": equal, "solved": int(a.success.sum())})
  )


if __name__ == "__main__":
  main()
