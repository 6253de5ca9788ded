"""Test helpers shared across the suite."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib
import struct
from collections.abc import Callable, Iterator
from unittest import mock

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reference import envs as ref
from starpo_jax.algo.state import TrainState

# A float32 sum of n terms taken in another order (another batch layout,
# another device count, another CPU's kernels) moves by about
# sqrt(n) * eps of the terms' magnitude: 3.8e-5 for the 10^5 terms of a
# gradient element over a minibatch of a few thousand tokens. Quantities
# that are such sums (losses, gradients, an SGD step) agree to this
# fraction of their own scale, never to a fixed absolute figure.
F32_SUM_RTOL = float(np.sqrt(1e5) * np.finfo(np.float32).eps)


# The fuzz tests try a few hundred generated inputs in the suite; the slow
# opt-in run sets this many (docs/testing.md, "Bad inputs").
FUZZ_EXAMPLES = os.environ.get("STARPO_FUZZ_EXAMPLES")


def fuzz(examples: int) -> hypothesis.settings:
  """Hypothesis settings for a fuzz test: ``examples`` generated inputs,
  or ``$STARPO_FUZZ_EXAMPLES`` in the opt-in run."""
  return hypothesis.settings(
    max_examples=int(FUZZ_EXAMPLES or examples), deadline=None
  )


def small_state(value: float = 1.0, size: int = 3) -> TrainState:
  """A train state of one parameter vector ``w`` full of ``value``, for
  tests of checkpoints."""
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    policy=nnx.State({"w": nnx.Param(jnp.full(size, value))}),
    policy_opt=None,
    critic=None,
    critic_opt=None,
    reference=None,
    key=jax.random.key(0),
    nonfinite=jnp.zeros((), jnp.int32),
  )


def assert_close_at_scale(
  got, want, rtol: float = F32_SUM_RTOL, err_msg="", terms: float = 0.0
):
  """``got`` equals ``want`` to ``rtol`` of ``want``'s largest magnitude
  (a normwise comparison: an element near zero is held to its array's
  scale, not to its own), or of ``terms``, the magnitude of the terms
  summed, where that is larger (a sum that cancels keeps their rounding)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape, err_msg)
  scale = max(float(np.max(np.abs(want), initial=0.0)), terms)
  np.testing.assert_allclose(
    got, want, rtol=0, atol=rtol * scale, err_msg=err_msg
  )


def assert_same_step(old, got, want, rtol: float = F32_SUM_RTOL):
  """Parameters ``got`` and ``want`` moved from ``old`` by the same step
  (lists of arrays): each leaf's step to ``rtol`` of its largest element,
  plus the rounding of the parameters themselves (two ulps: a step far
  smaller than a weight is resolved only to the weight's precision).

  Meant for steps linear in the gradient (SGD). Adam's first step is
  ``lr * g / (|g| + eps)``: rounding noise in a gradient element near zero
  becomes a step anywhere in ``[-lr, lr]``, so Adam's parameters agree
  only as far as its gradients' signs do."""
  for o, a, b in zip(old, got, want, strict=True):
    o, a, b = (np.asarray(x, np.float64) for x in (o, a, b))
    step_a, step_b = a - o, b - o
    tol = rtol * np.max(np.abs(step_b)) + 2 * np.spacing(
      np.abs(b).astype(np.float32)
    )
    excess = np.abs(step_a - step_b) - tol
    assert excess.max(initial=-1.0) <= 0, (
      f"a leaf {o.shape} took another step: |got - want| = "
      f"{np.abs(step_a - step_b).max():.3g} against a step of "
      f"{np.abs(step_b).max():.3g}"
    )


def sgd_learner(setup):
  """``setup``'s learner with plain SGD at the run's learning rates: a
  step linear in the gradient, for equivalence tests
  (``assert_same_step``)."""
  import optax

  from starpo_jax.run import assembly

  o = setup.config.optim
  return dataclasses.replace(
    assembly.make_learner(setup),
    policy_tx=optax.sgd(o.lr),
    critic_tx=optax.sgd(o.critic_lr),
  )


def critic_with_opinions(state) -> None:
  """Gives ``state``'s critic a random value head (it starts at zero, and
  a critic of zeros checks nothing), in place."""
  critic = nnx.to_pure_dict(state.critic)
  rng = np.random.default_rng(0)
  critic["value_w"] = jnp.asarray(rng.normal(0, 0.5, critic["value_w"].shape))
  nnx.replace_by_pure_dict(state.critic, critic)


# Traces per counted function name, for compile-once checks.
TRACES: collections.Counter = collections.Counter()


def counted(name: str, fn: Callable) -> Callable:
  """``fn``, counting in ``TRACES[name]`` each time JAX traces it."""

  def wrapper(*args, **kwargs):
    TRACES[name] += 1
    return fn(*args, **kwargs)

  return wrapper


def assert_compiles_once(fn: Callable, *calls: tuple) -> list:
  """Jits ``fn``, calls it with each argument tuple, checks one trace.

  Returns:
    The outputs of the calls.
  """
  name = f"assert_compiles_once:{id(fn)}"
  TRACES[name] = 0
  jitted = jax.jit(counted(name, fn))
  outs = [jitted(*args) for args in calls]
  assert TRACES[name] == 1, (
    f"traced {TRACES[name]} times for {len(calls)} calls"
  )
  return outs


@contextlib.contextmanager
def traced_at_most_once(module, builder: str) -> Iterator[None]:
  """While active, what ``module.builder(...)`` builds is wrapped in
  ``chex.assert_max_traces(n=1)``: once jitted, a second trace of it (a
  recompilation, on any later call) raises ``AssertionError``."""
  build = getattr(module, builder)

  def once(*args, **kwargs):
    return chex.assert_max_traces(build(*args, **kwargs), n=1)

  with mock.patch.object(module, builder, once):
    yield


def peer_of(name, env, s):
  """The plain-Python peer of one (unbatched, host) Sokoban or FrozenLake
  state ``s`` of ``env``."""
  cells = lambda m, cols: {divmod(int(i), cols) for i in np.flatnonzero(m)}
  if name == "sokoban":
    return ref.Sokoban(
      walls=cells(s.walls, env.cols),
      targets=cells(s.targets, env.cols),
      boxes=cells(s.boxes, env.cols),
      player=divmod(int(s.player), env.cols),
      rows=env.rows,
      cols=env.cols,
      max_steps=env.max_steps,
    )
  return ref.FrozenLake(
    holes=cells(s.holes, env.size),
    start=divmod(int(s.start), env.size),
    goal=divmod(int(s.goal), env.size),
    size=env.size,
    max_steps=env.max_steps,
  )


def read_tensorboard(folder) -> dict[tuple[str, int], float]:
  """Every scalar in the TensorBoard event files under ``folder``, by (tag,
  step), read from the TFRecord framing (length, CRC, Event proto, CRC)."""
  from tensorboardX.proto import event_pb2

  out = {}
  for path in sorted(pathlib.Path(folder).rglob("events.out.tfevents*")):
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4
      for value in event.summary.value:
        out[(value.tag, event.step)] = value.simple_value
  return out
