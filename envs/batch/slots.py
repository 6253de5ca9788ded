"""The host side of the Python-environment bridge (``envs.batch.host``):
one environment object per batch slot, stepped in threads, each call
bounded in time, each fault recorded against its slot."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from envs.host import HostEnv, HostSpec


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


class Slots:
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
      out = self._empty_turn(*actions.shape, used)
      results: dict[int, dict[str, Any]] = {}
      threads = []
      for i in np.flatnonzero(active).tolist():
        env = self.envs.get(offset + i)
        if env is None:
          results[i] = {"fault": "no environment (its reset failed)"}
          continue
        moves, ids = self._moves(actions[i], answers[i], answer_lengths[i])
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

  def _empty_turn(self, b: int, a: int, used: np.ndarray) -> dict:
    """What ``act`` returns for a turn where nothing was stepped."""
    return dict(
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

  def _moves(self, actions, answer, length) -> tuple[list[str], list[int]]:
    """One episode's turn as what its environment's ``step`` takes, in
    order, and the action ids they stand for: the action names, or the
    answer text once."""
    if self.spec.action_names:
      ids = [int(x) for x in actions if int(x) >= 0]
      return [self.spec.action_names[x] for x in ids], ids
    raw = bytes(answer[: int(length)].astype(np.uint8))
    text = raw.decode("utf-8", "replace")
    # A reply with no (or a blank) answer steps nothing, as with a
    # jittable environment.
    return ([text], [0]) if int(actions[0]) >= 0 else ([], [])

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


# What ``Slots.act`` returns for a turn: name -> (shape, dtype), shapes
# over the batch b, the observation budget t and the turn's actions a.
TURN_FIELDS = {
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
