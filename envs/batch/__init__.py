"""The batched environment protocol: what the rollout, the warm start and
the evaluator step, whatever kind of environment is behind it.

  env = envs.batched(envs.make(name))   # either kind, adapted once
  env = env.bind(tokenizer.encode, batch_axes)
  states = env.reset(keys)              # keys [B]: equal keys, equal levels
  pieces, n = env.render(states)        # [B, N], [B]: ids into spec.pieces
                                        # (tokens if spec.token_observations)
  turn = env.act(states, actions, answer, active, used, budget)

Two adapters implement it: ``VmapEnv`` runs a jittable environment
(``envs.core.Env``, one episode's pure functions) under ``vmap``;
``HostEnvironment`` runs Python environments (``envs.host.HostSpec``) in
one host call for the batch. ``batched`` is the one place that tells the
kinds apart; code that holds a ``BatchEnv`` asks only for capabilities
(``jittable``: the per-episode environment the warm start's experts
plan with, or None).
"""

from __future__ import annotations

from typing import Any

from envs.batch.call import host_call, reset_seeds
from envs.batch.host import HostEnvironment
from envs.batch.protocol import BatchEnv, Turn
from envs.batch.vmap import VmapEnv
from envs.host import HostSpec


def batched(env: Any) -> BatchEnv:
  """``env`` (a jittable ``Env``, a ``HostSpec``, or already a
  ``BatchEnv``) as a ``BatchEnv``."""
  if isinstance(env, VmapEnv | HostEnvironment):
    return env
  if isinstance(env, HostSpec):
    return HostEnvironment(env)
  return VmapEnv(env)


__all__ = [
  "BatchEnv",
  "HostEnvironment",
  "Turn",
  "VmapEnv",
  "batched",
  "host_call",
  "reset_seeds",
]
