"""Environments that are Python programs, stepped from the compiled rollout.

A host environment is an object per episode with two methods:

  observation = env.reset(seed)                       # str
  observation, reward, done, info = env.step(answer)  # str, float, bool, dict

``answer`` is one action name (an environment with ``action_names``: the
rollout plays a reply's ``<answer>A || B</answer>`` one name at a time) or
the whole answer text (free-text answers). ``info`` may say ``success``,
``truncated`` (the episode ran out of steps rather than ended),
``valid`` (the action was available) and ``effective`` (it changed the
state); missing keys read False, False, True, True.

``HostEnvironment`` wraps a ``HostSpec`` into what the rollout steps:
``reset_batch`` and ``act`` each make ONE host call for the whole batch
(``jax.experimental.io_callback``) inside the compiled step, and the
observations come back as tokens of the run's tokenizer (bind it with
``with_tokenizer``), cut to ``max_obs_tokens``. One host call per turn
costs 0.3 ms for 128 episodes on a 2-core CPU; a callback per episode
(``vmap`` of a callback runs them one after another) cost 61 ms.

On a mesh that shards the episode batch (``with_tokenizer``'s
``batch_axes``), the calls run per shard, each in the process that holds
it.

Faults end an episode, never the run: a ``reset`` or ``step`` that raises,
returns the wrong types, or takes longer than ``timeout_s`` ends its
episode (recorded in ``error``); the episode's object is replaced by a
fresh one at the next reset.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from envs.core import EnvSpec


class HostEnv(Protocol):
  """One episode of a Python environment."""

  def reset(self, seed: int, level: Any = None) -> str: ...

  def step(self, answer: str) -> tuple[str, float, bool, dict[str, Any]]: ...


@dataclasses.dataclass(frozen=True)
class HostSpec:
  """A Python environment as the rollout sees it.

  Attributes:
    name: registry name.
    make: builds one episode's environment object (called once per batch
      slot, and again for a slot whose object failed).
    instructions: the task description shown in the system prompt.
    action_names: the names an answer is made of; empty for free text.
    pieces: strings observations are made of (a compact tokenizer learns
      them as tokens; any other text still encodes byte by byte).
    legend: (symbol, meaning) pairs the system prompt explains.
    max_obs_tokens: an observation's budget in tokens; longer ones are cut
      (and counted). The turn's prompt holds that many, so a loose budget
      costs compute on every turn.
    max_obs_pieces: where an observation is made of at most this many of
      ``pieces`` (a grid's cells and newlines), its budget is fixed when
      the tokenizer is bound: this many times the longest piece in
      tokens, in place of ``max_obs_tokens``.
    max_steps: actions (or answers) after which an episode is truncated.
    timeout_s: the longest one episode's reset or turn may take.
    levels: optionally, a jittable function from a reset key to a dict of
      arrays describing a level (e.g. a jittable environment's generator):
      the compiled step draws each episode's level with it and ``reset``
      receives it as ``level`` (a dict of NumPy arrays), so a Python
      environment can play the very levels a jittable one does.
    tools: tools (``envs.tools``) the agent may call before it answers.
  """

  name: str
  make: Callable[[], HostEnv]
  instructions: str
  action_names: tuple[str, ...] = ()
  pieces: tuple[str, ...] = ()
  legend: tuple[tuple[str, str], ...] = ()
  max_obs_tokens: int = 128
  max_obs_pieces: int = 0
  max_steps: int = 100
  timeout_s: float = 10.0
  levels: Callable[[jax.Array], dict[str, jax.Array]] | None = None
  tools: tuple[str, ...] = ()

  def __post_init__(self) -> None:
    if self.max_obs_tokens < 1:
      raise ValueError(
        f"{self.name}: max_obs_tokens={self.max_obs_tokens} must be >= 1"
      )
    if self.max_obs_pieces < 0 or (self.max_obs_pieces and not self.pieces):
      raise ValueError(
        f"{self.name}: max_obs_pieces={self.max_obs_pieces} needs pieces "
        "to count (and must be >= 0)"
      )
    if not self.timeout_s > 0:
      raise ValueError(f"{self.name}: timeout_s={self.timeout_s} must be > 0")


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


@struct.dataclass
class HostTurn:
  """What one turn of host steps did, per episode ``[B]`` (``executed``
  ``[A, B]``: the actions played, -1 where none was). ``stepped``: the
  environment took at least one step (``success`` and ``terminated`` are
  its last step's)."""

  states: HostState
  used: jax.Array
  done: jax.Array
  reward: jax.Array
  effective: jax.Array
  stepped: jax.Array
  success: jax.Array
  terminated: jax.Array
  unavailable: jax.Array
  executed: jax.Array


class Fault(Exception):
  """An episode's environment failed; the message says how."""


def call_bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
  """``fn()`` in a daemon thread, waited for at most ``timeout_s``.

  Raises:
    Fault: it raised (its message) or did not return in time.
  """
  out: dict[str, Any] = {}

  def run() -> None:
    try:
      out["value"] = fn()
    except Exception as e:  # an environment's bug ends its episode only
      out["error"] = f"{type(e).__name__}: {e}"

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    raise Fault(f"no answer within {timeout_s:g} s")
  if "error" in out:
    raise Fault(out["error"])
  return out["value"]


def _checked_step(result: Any) -> tuple[str, float, bool, dict[str, Any]]:
  """A step's result with its types checked.

  Raises:
    Fault: not ``(str, finite number, bool, dict)``.
  """
  if not (isinstance(result, tuple) and len(result) == 4):
    raise Fault(
      f"step returned {type(result).__name__}, not (observation, reward, "
      "done, info)"
    )
  obs, reward, done, info = result
  if not isinstance(obs, str):
    raise Fault(f"step's observation is {type(obs).__name__}, not str")
  if isinstance(reward, bool) or not isinstance(reward, (int, float)):
    raise Fault(f"step's reward is {type(reward).__name__}, not a number")
  if not math.isfinite(reward):
    raise Fault(f"step's reward is {reward}")
  if not isinstance(done, (bool, np.bool_)):
    raise Fault(f"step's done is {type(done).__name__}, not bool")
  if not isinstance(info, dict):
    raise Fault(f"step's info is {type(info).__name__}, not dict")
  return obs, float(reward), bool(done), info


class _Slots:
  """The host side: one environment object per batch slot this process
  steps, the last error of each, and the tokenizer observations go
  through. Calls get a shard of the batch: row ``i`` is slot
  ``offset + i``."""

  def __init__(self, spec: HostSpec, encode: Callable[[str], list[int]]):
    self.spec = spec
    self.encode = encode
    self.envs: dict[int, HostEnv | None] = {}
    self.errors: dict[int, str | None] = {}
    self.lock = threading.Lock()

  def _tokens(self, text: str) -> tuple[np.ndarray, int, bool]:
    ids = list(self.encode(text))
    width = self.spec.max_obs_tokens
    row = np.zeros((width,), np.int32)
    row[: min(len(ids), width)] = ids[:width]
    return row, min(len(ids), width), len(ids) > width

  def reset(
    self,
    offset: int,
    seeds: np.ndarray,
    levels: dict[str, np.ndarray] | None,
  ):
    """Resets row b's slot with ``seeds[b]`` (and row b of ``levels``, if
    given): observations ``[B, T]``, lengths, failed, truncated."""
    with self.lock:
      b = len(seeds)
      obs = np.zeros((b, self.spec.max_obs_tokens), np.int32)
      length = np.zeros((b,), np.int32)
      failed = np.zeros((b,), bool)
      cut = np.zeros((b,), bool)
      for i, seed in enumerate(seeds.tolist()):
        slot = offset + i
        self.errors[slot] = None
        try:
          if self.envs.get(slot) is None:
            self.envs[slot] = call_bounded(self.spec.make, self.spec.timeout_s)
          env = self.envs[slot]
          if levels is None:
            start = lambda e=env, s=seed: e.reset(s)
          else:
            level = {k: v[i] for k, v in levels.items()}
            start = lambda e=env, s=seed, v=level: e.reset(s, level=v)
          text = call_bounded(start, self.spec.timeout_s)
          if not isinstance(text, str):
            raise Fault(f"reset returned {type(text).__name__}, not str")
          obs[i], length[i], cut[i] = self._tokens(text)
        except Fault as e:
          self.envs[slot] = None  # a fresh object at the next reset
          self.errors[slot] = f"reset: {e}"
          failed[i] = True
      return obs, length, failed, cut

  def act(
    self,
    offset: int,
    actions: np.ndarray,
    answers: np.ndarray,
    answer_lengths: np.ndarray,
    active: np.ndarray,
    used: np.ndarray,
    budget: int,
  ):
    """Plays each active episode's turn: its actions in order (or its
    answer text) until it ends or its budget runs out; the episodes run in
    threads, each waited for at most ``timeout_s``."""
    with self.lock:
      b, a = actions.shape
      out = dict(
        obs=np.zeros((b, self.spec.max_obs_tokens), np.int32),
        length=np.zeros((b,), np.int32),
        used=used.astype(np.int32).copy(),
        done=np.zeros((b,), bool),
        reward=np.zeros((b,), np.float32),
        effective=np.zeros((b,), bool),
        success=np.zeros((b,), bool),
        terminated=np.zeros((b,), bool),
        unavailable=np.zeros((b,), np.int32),
        error=np.zeros((b,), bool),
        cut=np.zeros((b,), bool),
        executed=np.full((a, b), -1, np.int32),
        changed=np.zeros((b,), bool),
      )
      results: dict[int, dict[str, Any]] = {}
      threads = []
      for i in np.flatnonzero(active).tolist():
        env = self.envs.get(offset + i)
        if env is None:
          results[i] = {"fault": "no environment (its reset failed)"}
          continue
        if self.spec.action_names:
          moves = [
            self.spec.action_names[int(x)] for x in actions[i] if int(x) >= 0
          ]
          ids = [int(x) for x in actions[i] if int(x) >= 0]
        else:
          n = int(answer_lengths[i])
          raw = bytes(answers[i, :n].astype(np.uint8))
          text = raw.decode("utf-8", "replace")
          # A reply with no (or a blank) answer steps nothing, as with
          # a jittable environment.
          given = int(actions[i, 0]) >= 0
          moves, ids = ([text], [0]) if given else ([], [])
        left = max(0, budget - int(used[i]))
        results[i] = {}
        thread = threading.Thread(
          target=self._turn,
          args=(env, moves[:left], ids[:left], results[i]),
          daemon=True,
        )
        thread.start()
        threads.append((i, thread))
      deadline = self.spec.timeout_s
      for i, thread in threads:
        thread.join(deadline)
        if thread.is_alive():
          results[i] = {"fault": f"no answer within {deadline:g} s"}
      for i, r in results.items():
        self._record(i, offset + i, r, out)
      return out

  def random_play(
    self, offset: int, seeds: np.ndarray, horizon: int
  ) -> np.ndarray:
    """Plays each slot's episode (as reset) with up to ``horizon``
    uniformly random action names, slot b drawing from ``seeds[b]``;
    which ended in success. A fault ends the episode unsolved."""
    with self.lock:
      names = self.spec.action_names
      won = np.zeros((len(seeds),), bool)
      results: dict[int, dict[str, Any]] = {}
      threads = []
      for i, seed in enumerate(seeds.tolist()):
        env = self.envs.get(offset + i)
        if env is None:
          continue
        rng = np.random.default_rng(seed)
        moves = [names[a] for a in rng.integers(0, len(names), horizon)]
        results[i] = {}
        thread = threading.Thread(
          target=self._turn,
          args=(env, moves, [0] * horizon, results[i]),
          daemon=True,
        )
        thread.start()
        threads.append((i, thread))
      for i, thread in threads:
        thread.join(self.spec.timeout_s)
        r = results[i]
        if thread.is_alive() or "fault" in r or not r.get("steps"):
          continue
        *_, done, info = r["steps"][-1]
        won[i] = done and bool(info.get("success", False))
      return won

  def _turn(self, env, moves, ids, r: dict[str, Any]) -> None:
    """One episode's turn, in its own thread: ``r`` gets what happened."""
    steps = []
    try:
      for name, action in zip(moves, ids, strict=True):
        obs, reward, done, info = _checked_step(env.step(name))
        steps.append((action, obs, reward, done, info))
        if done:
          break
    except Fault as e:
      r["fault"] = str(e)
    except Exception as e:  # an environment's bug ends its episode only
      r["fault"] = f"{type(e).__name__}: {e}"
    r["steps"] = steps

  def _record(
    self, i: int, slot: int, r: dict[str, Any], out: dict[str, Any]
  ) -> None:
    steps = r.get("steps", [])
    for k, (action, _, reward, _, info) in enumerate(steps):
      out["executed"][k, i] = action
      out["reward"][i] += reward
      out["used"][i] += 1
      out["effective"][i] |= bool(info.get("effective", True))
      out["unavailable"][i] += not bool(info.get("valid", True))
    if steps:
      _, obs, _, done, info = steps[-1]
      out["obs"][i], out["length"][i], out["cut"][i] = self._tokens(obs)
      out["changed"][i] = True
      out["success"][i] = bool(info.get("success", False))
      out["terminated"][i] = done and not bool(info.get("truncated", False))
      out["done"][i] = done
    if "fault" in r:
      self.errors[slot] = f"step: {r['fault']}"
      self.envs[slot] = None
      out["error"][i] = True
      out["done"][i] = True


# What ``_Slots.act`` returns for a turn: name -> (shape, dtype), shapes
# over the batch b, the observation budget t and the turn's actions a.
_TURN_FIELDS = {
  "obs": ("bt", jnp.int32),
  "length": ("b", jnp.int32),
  "used": ("b", jnp.int32),
  "done": ("b", jnp.bool_),
  "reward": ("b", jnp.float32),
  "effective": ("b", jnp.bool_),
  "success": ("b", jnp.bool_),
  "terminated": ("b", jnp.bool_),
  "unavailable": ("b", jnp.int32),
  "error": ("b", jnp.bool_),
  "cut": ("b", jnp.bool_),
  "executed": ("ab", jnp.int32),
  "changed": ("b", jnp.bool_),
}


def reset_seeds(keys: jax.Array) -> jax.Array:
  """The seeds ``[B]`` (int32) host environments reset with, from reset
  keys ``[B]``."""
  return jax.vmap(
    lambda k: jax.random.randint(k, (), 0, np.iinfo(np.int32).max)
  )(keys)


def host_call(
  fn: Callable[..., tuple[np.ndarray, ...]],
  outs: tuple[jax.ShapeDtypeStruct, ...],
  batch_dims: tuple[int, ...],
  batch_axes: tuple[str, ...],
  *args: Any,
) -> tuple[jax.Array, ...]:
  """``fn(offset, *args)`` on the host, args as NumPy: ONE call for the
  whole batch, or, traced for a mesh that shards the batch (axis 0 of
  every arg) over ``batch_axes``, one per shard (its rows are slots
  ``offset`` on), run by the process holding the shard. Devices that
  hold a copy of a shard (other mesh axes) skip the call and take the
  stepping device's result.
  ``batch_dims``: each output's batch axis."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(
    a
    for a in batch_axes
    if not mesh.empty and a in mesh.axis_names and mesh.shape[a] > 1
  )
  shards = math.prod(mesh.shape[a] for a in axes)
  b = jax.tree.leaves(args)[0].shape[0]
  on_host = lambda offset, *x: fn(int(offset), *jax.tree.map(np.asarray, x))
  if shards == 1 or b % shards:
    return io_callback(lambda *x: on_host(0, *x), outs, *args)
  rows = b // shards
  local = tuple(
    jax.ShapeDtypeStruct((*s.shape[:d], rows, *s.shape[d + 1 :]), s.dtype)
    for s, d in zip(outs, batch_dims, strict=True)
  )
  copies = tuple(
    a for a in mesh.axis_names if a not in axes and mesh.shape[a] > 1
  )

  def one_shard(offset, lead, *x):
    if not lead:
      return tuple(np.zeros(s.shape, s.dtype) for s in local)
    return on_host(offset, *x)

  def body(*x):
    offset = jax.lax.axis_index(axes) * rows
    lead = jnp.ones((), bool)
    for a in copies:
      lead &= jax.lax.axis_index(a) == 0
    got = io_callback(one_shard, local, offset, lead, *x)
    if not copies:
      return got
    return tuple(
      jax.lax.psum(g.astype(jnp.int32), copies).astype(g.dtype)
      if g.dtype == jnp.bool_
      else jax.lax.psum(g, copies)
      for g in got
    )

  spec = jax.sharding.PartitionSpec(axes)
  return jax.shard_map(
    body,
    mesh=mesh,
    in_specs=jax.tree.map(lambda _: spec, args),
    out_specs=tuple(
      jax.sharding.PartitionSpec(*([None] * d), axes) for d in batch_dims
    ),
    check_vma=False,
  )(*args)


@dataclasses.dataclass(frozen=True, eq=False)
class HostEnvironment:
  """A ``HostSpec`` as the rollout steps it (see the module docstring).

  Built unbound by ``envs.make``; ``with_tokenizer`` binds the run's
  tokenizer (the observations' tokens), after which ``reset_batch`` and
  ``act`` work inside ``jit``. Its ``spec`` says ``token_observations``:
  ``render`` returns tokens, not piece ids.
  """

  host: HostSpec
  slots: _Slots | None = None
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

  def with_tokenizer(
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
    return HostEnvironment(host, _Slots(host, encode), tuple(batch_axes))

  def _bound(self) -> _Slots:
    if self.slots is None:
      raise RuntimeError(
        f"host environment {self.host.name!r} has no tokenizer: bind the "
        "run's with with_tokenizer(tokenizer.encode)"
      )
    return self.slots

  def render(self, state: HostState) -> tuple[jax.Array, jax.Array]:
    """The observation's tokens ``[max_obs_tokens]`` and how many."""
    return state.obs, state.length

  def reset_batch(self, keys: jax.Array) -> HostState:
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
  ) -> HostTurn:
    """One turn of every active episode ``[B]``, in one host call:
    ``actions [B, A]`` (action ids, -1 for none) or, for free-text
    answers, ``answer`` (``envs.Answer`` batched); at most ``budget``
    actions an episode in all."""
    slots = self._bound()
    b, a = actions.shape
    t = self.host.max_obs_tokens
    names = list(_TURN_FIELDS)
    shapes = tuple(
      jax.ShapeDtypeStruct({"b": (b,), "bt": (b, t), "ab": (a, b)}[dims], dtype)
      for dims, dtype in _TURN_FIELDS.values()
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
      tuple(1 if dims == "ab" else 0 for dims, _ in _TURN_FIELDS.values()),
      self.batch_axes,
      actions,
      data,
      lengths,
      live,
      used,
    )
    out = dict(zip(names, got, strict=True))
    stepped = out["changed"]
    error = states.error | out["error"]
    new = HostState(
      obs=jnp.where(stepped[:, None], out["obs"], states.obs),
      length=jnp.where(stepped, out["length"], states.length),
      error=error,
      cut=states.cut + out["cut"],
      key=states.key,
    )
    return HostTurn(
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

  def errors(self) -> Sequence[str | None]:
    """Each slot's last fault (None where it had none or another process
    steps it), host-side."""
    errors = self._bound().errors
    return [errors.get(i) for i in range(max(errors, default=-1) + 1)]
