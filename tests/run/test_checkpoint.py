"""The digest a LoRA checkpoint keeps of its base: equal for equal weights,
different when any value, position, dtype or name differs; which steps a
run keeps (the latest, and the warm start's last)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import sokoban
from starpo_jax.run import checkpoint, train
from tests.helpers import small_state


def state(**arrays) -> nnx.State:
  return nnx.State({k: nnx.Param(v) for k, v in arrays.items()})


def test_the_digest_sees_every_value_its_place_its_dtype_and_its_name():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
  q = jnp.asarray(rng.integers(-8, 8, size=(3, 5)), jnp.int4)
  h = jnp.asarray(rng.normal(size=(7,)), jnp.bfloat16)
  first = checkpoint.digest(state(w=w, q=q, h=h))
  assert len(first) == 16
  assert checkpoint.digest(state(w=jnp.array(w), q=q, h=h)) == first
  one_ulp = w.at[3, 5].set(jnp.nextafter(w[3, 5], jnp.inf))
  swapped = w.at[0, 0].set(w[0, 1]).at[0, 1].set(w[0, 0])
  changes = [
    state(w=one_ulp, q=q, h=h),
    state(w=swapped, q=q, h=h),
    state(w=w.reshape(6, 4), q=q, h=h),
    state(w=w, q=q.at[2, 4].add(1), h=h),
    state(w=w, q=q, h=h.at[0].set(-h[0])),
    state(w=w.astype(jnp.bfloat16), q=q, h=h),
    state(v=w, q=q, h=h),
  ]
  digests = [checkpoint.digest(s) for s in changes]
  assert first not in digests and len(set(digests)) == len(digests)


def test_the_latest_and_the_warm_starts_last_step_are_kept(tmp_path):
  state = small_state()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, also_keep=(2,))
  for step in range(1, 7):
    ckpt.save(step, state)
  ckpt.close()
  assert sorted(ckpt.manager.all_steps()) == [2, 5, 6]


def test_a_run_keeps_its_warm_starts_last_step_beside_the_latest(tmp_path):
  c = sokoban.get_config(None)
  c.sft.steps, c.sft.episodes = 3, 8
  c.train.steps, c.train.eval_every = 2, 0
  c.train.checkpoint_every, c.train.keep_checkpoints = 1, 1
  c.rollout.env_groups, c.rollout.group_size = 2, 2
  c.rollout.max_turns = 1
  c.diagnostics.collapse_every = c.diagnostics.gradients_every = 0
  train.run(c, str(tmp_path))
  kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir())
  assert kept == [3, 5]
