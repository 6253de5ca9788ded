"""Python environments (``envs.host``) as a ``BatchEnv``: the batch's
episodes stepped from inside the compiled rollout.

``reset`` and ``act`` each make ONE host call for the whole batch
(``envs.batch.call.host_call``), and the observations come back as tokens
of the run's tokenizer (``bind`` it), cut to ``max_obs_tokens``: one
host call a turn, where a callback per episode (``vmap`` of a callback
runs them one after another) would cost one each
(``python -m benchmarks.components.host_bridge`` measures the bridge).

On a mesh that shards the episode batch (``bind``'s ``batch_axes``), the
calls run per shard, each in the process that holds it.

Faults end an episode, never the run: a ``reset`` or ``step`` that raises,
returns the wrong types, or takes longer than ``timeout_s`` ends its
episode (recorded in ``error``); the episode's object is replaced by a
fresh one at the next reset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.batch.call import host_call, reset_seeds
from envs.batch.protocol import Turn
from envs.batch.slots import TURN_FIELDS, Slots
from envs.core import EnvSpec
from envs.host import HostSpec


@struct.dataclass
class HostState:
  """An episode of a host environment, as the compiled rollout holds it:
  its slot's current observation in tokens, whether a fault ended it, and
  how many of its observations were cut to the budget. ``key`` is unused
  (the host object holds its own randomness); the rollout sets it like
  any environment state's."""

  obs: jax.Array  # [max_obs_tokens] int32
  length: jax.Array  # [] int32
  error: jax.Array  # [] bool: a reset or step failed and ended it
  cut: jax.Array  # [] int32 observations longer than the budget
  key: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class HostEnvironment:
  """A ``HostSpec`` as the rollout steps it (see the module docstring).

  Built unbound by ``envs.batched``; ``bind`` binds the run's
  tokenizer (the observations' tokens), after which ``reset`` and
  ``act`` work inside ``jit``. Its ``spec`` says ``token_observations``:
  ``render`` returns tokens, not piece ids.
  """

  host: HostSpec
  slots: Slots | None = None
  batch_axes: tuple[str, ...] = ()

  @property
  def spec(self) -> EnvSpec:
    h = self.host
    return EnvSpec(
      name=h.name,
      pieces=h.pieces,
      action_names=h.action_names,
      instructions=h.instructions,
      legend=h.legend,
      list_actions=bool(h.action_names),
      max_obs_pieces=h.max_obs_tokens,
      max_steps=h.max_steps,
      text_answers=not h.action_names,
      token_observations=True,
      tools=h.tools,
    )

  def bind(
    self,
    encode: Callable[[str], list[int]],
    batch_axes: tuple[str, ...] = (),
  ) -> HostEnvironment:
    """This environment with observations encoded by ``encode``.

    ``batch_axes``: the mesh axes the episode batch is sharded over. Traced
    for a mesh with them (``jax.sharding.use_abstract_mesh``), each shard's
    episodes are stepped by the process that holds the shard (one host
    call per shard, ``shard_map``); otherwise one call steps them all.
    """
    host = self.host
    if host.max_obs_pieces:
      longest = max(len(encode(p)) for p in host.pieces)
      host = dataclasses.replace(
        host, max_obs_tokens=host.max_obs_pieces * longest
      )
    return HostEnvironment(host, Slots(host, encode), tuple(batch_axes))

  @property
  def jittable(self) -> None:
    """A Python environment has no jittable per-episode form."""
    return None

  def failed(self, states: HostState) -> jax.Array:
    return states.error

  def cut(self, states: HostState) -> jax.Array:
    return states.cut

  def _bound(self) -> Slots:
    if self.slots is None:
      raise RuntimeError(
        f"host environment {self.host.name!r} has no tokenizer: bind the "
        "run's with bind(tokenizer.encode)"
      )
    return self.slots

  def render(self, state: HostState) -> tuple[jax.Array, jax.Array]:
    """The observation's tokens ``[max_obs_tokens]`` and how many."""
    return state.obs, state.length

  def reset(self, keys: jax.Array) -> HostState:
    """Episodes ``[B]`` from reset keys (equal keys, equal seeds: a
    group's members share a level)."""
    slots = self._bound()
    b, t = keys.shape[0], self.host.max_obs_tokens
    seeds = reset_seeds(keys)
    levels = (
      None if self.host.levels is None else jax.vmap(self.host.levels)(keys)
    )
    outs = (
      jax.ShapeDtypeStruct((b, t), jnp.int32),
      jax.ShapeDtypeStruct((b,), jnp.int32),
      jax.ShapeDtypeStruct((b,), jnp.bool_),
      jax.ShapeDtypeStruct((b,), jnp.bool_),
    )
    if levels is None:
      got = host_call(
        lambda o, s: slots.reset(o, s, None),
        outs,
        (0,) * 4,
        self.batch_axes,
        seeds,
      )
    else:
      got = host_call(
        slots.reset, outs, (0,) * 4, self.batch_axes, seeds, levels
      )
    obs, length, failed, cut = got
    return HostState(
      obs=obs,
      length=length,
      error=failed,
      cut=cut.astype(jnp.int32),
      key=keys,
    )

  def act(
    self,
    states: HostState,
    actions: jax.Array,
    answer: Any,
    active: jax.Array,
    used: jax.Array,
    budget: int,
  ) -> Turn:
    """One turn of every active episode ``[B]``, in one host call:
    ``actions [B, A]`` (action ids, -1 for none) or, for free-text
    answers, ``answer`` (``envs.Answer`` batched); at most ``budget``
    actions an episode in all."""
    slots = self._bound()
    b, a = actions.shape
    t = self.host.max_obs_tokens
    names = list(TURN_FIELDS)
    shapes = tuple(
      jax.ShapeDtypeStruct({"b": (b,), "bt": (b, t), "ab": (a, b)}[dims], dtype)
      for dims, dtype in TURN_FIELDS.values()
    )

    def host(offset, *args):
      out = slots.act(offset, *args, budget)
      return tuple(out[n] for n in names)

    data = answer.data if answer is not None else jnp.zeros((b, 1), jnp.int32)
    lengths = (
      answer.length if answer is not None else jnp.zeros((b,), jnp.int32)
    )
    live = active & ~states.error
    got = host_call(
      host,
      shapes,
      tuple(1 if dims == "ab" else 0 for dims, _ in TURN_FIELDS.values()),
      self.batch_axes,
      actions,
      data,
      lengths,
      live,
      used,
    )
    return _turn(states, dict(zip(names, got, strict=True)), active)

  def random_success(
    self, states: HostState, horizon: int, key: jax.Array
  ) -> jax.Array:
    """Which episodes ``[B]`` (just reset) a player solves that takes up
    to ``horizon`` uniformly random actions: the random baseline."""
    if not self.host.action_names:
      raise ValueError(
        f"host environment {self.host.name!r} answers in free text: it has "
        "no random player to compare against"
      )
    slots = self._bound()
    b = states.length.shape[0]
    seeds = reset_seeds(jax.random.split(key, b))
    (won,) = host_call(
      lambda o, s: (slots.random_play(o, s, horizon),),
      (jax.ShapeDtypeStruct((b,), jnp.bool_),),
      (0,),
      self.batch_axes,
      seeds,
    )
    return won & ~states.error

  def errors(self) -> list[str | None]:
    """Each slot's last fault (None where it had none or another process
    steps it), host-side."""
    errors = self._bound().errors
    return [errors.get(i) for i in range(max(errors, default=-1) + 1)]


def _turn(states: HostState, out: dict[str, jax.Array], active) -> Turn:
  """The host call's results (``Slots.act``) as the turn's ``Turn``: the
  episodes that stepped show their new observations; a fault ends its
  episode."""
  stepped = out["changed"]
  error = states.error | out["error"]
  new = HostState(
    obs=jnp.where(stepped[:, None], out["obs"], states.obs),
    length=jnp.where(stepped, out["length"], states.length),
    error=error,
    cut=states.cut + out["cut"],
    key=states.key,
  )
  return Turn(
    states=new,
    used=out["used"],
    done=out["done"] | (active & error),
    reward=out["reward"],
    effective=out["effective"],
    stepped=stepped,
    success=out["success"],
    terminated=out["terminated"],
    unavailable=out["unavailable"],
    executed=out["executed"],
  )
