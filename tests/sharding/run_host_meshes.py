"""gym_sokoban's rollout, and the jittable Sokoban's with observations
tokenized as text on the host, on one device and on a 2 x 2 x 2 mesh of 8
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
from starpo_jax.algo.experts import ScriptedPolicy
from tests.envs.test_host import CFG, script_from
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
  out, calls, text, text_calls = {}, {}, {}, {}
  for shape in ((1, 1, 1), (2, 2, 2)):
    env = envs.batched(envs.make("gym_sokoban", levels="sokoban")).bind(
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
    text[shape] = _text_observations(
      tok, cfg, policy, mesh, text_calls.setdefault(str(shape), [])
    )
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
    json.dumps(
      {
        "calls": calls,
        "equal": equal,
        "solved": int(a.success.sum()),
        "text_calls": text_calls,
        "text_equal": all(
          np.array_equal(t.tokens, a.tokens) for t in text.values()
        ),
      }
    )
  )


class _Recorded:
  """``TextObservations`` that notes each call's slot offset and rows."""

  def __init__(self, inner, seen: list):
    self.inner, self.seen, self.batch_axes = inner, seen, inner.batch_axes

  def __call__(self, offset, pieces, n):
    self.seen.append([int(offset), len(n)])
    return self.inner(offset, pieces, n)


def _text_observations(tok, cfg, policy, mesh, seen: list):
  """The jittable Sokoban's rollout, its observations tokenized as text by
  one host call per batch shard."""
  env = envs.make("sokoban")
  codec = codec_lib.Codec.build(
    tok, env.spec, cfg.prompt_settings(), batch_axes=sharding.BATCH
  )
  codec = codec.replace(
    text_observations=_Recorded(codec.text_observations, seen)
  )
  play = sharding.traced_for(
    mesh,
    lambda p, c, k: rollout.rollout(
      p, c, env, cfg, k, sharding.batch_constraint(mesh, cfg.batch)
    ),
  )
  return jax.tree.map(
    np.asarray, jax.jit(play)(policy, codec, jax.random.key(3))
  )


if __name__ == "__main__":
  main()
