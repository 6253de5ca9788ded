"""The suites' rows: each measures starpo-jax and its PyTorch baseline
on the same ``Pair`` (``benchmarks.compare.run`` runs each side in its own
process and merges them)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.compare import kernels
from benchmarks.compare.rows import Measured, row, torch_rate
from benchmarks.compare.workload import (
  Pair,
  PeakMemory,
  Timing,
  forward_flops,
  timed_together,
)
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.algo import batch as batch_lib
from starpo_jax.algo import diagnostics
from starpo_jax.algo import spec as spec_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.run import assembly

# ----------------------------------------------------------------------------
# Suites.


def env_suite(smoke: bool, peak: dict[str, float]) -> list[dict[str, Any]]:
  from benchmarks.components import envs as env_bench

  batches = (64,) if smoke else (1, 64, 4096)
  gym = env_bench.gym_sokoban_rates()
  py = env_bench.python_rates("sokoban")
  rows = []
  for batch in batches:
    with PeakMemory() as mem:
      r = env_bench.jax_row("sokoban", batch)
    extra = dict(
      compile_s=r["step_compile_s"] + r["reset_compile_s"], peak_gib=mem.gib
    )
    where = f"sokoban 6x6, batch {batch}"
    for key, metric in (
      ("steps_per_s", "steps/s"),
      ("levels_per_s", "levels/s"),
    ):
      for baseline, value in (
        ("gym-sokoban", gym[key]),
        ("plain Python", py[f"py_{key}"]),
      ):
        rows.append(
          row("env", where, metric, r[f"jax_{key}"], baseline, value, **extra)
        )
  return rows


def rollout_baselines(pair: Pair) -> list[tuple[str, str, bool]]:
  """(generator kind, label, torch.compile) of the rollout's baselines."""
  return [
    ("dynamic", "transformers generate + Python envs", False),
    ("static", "static-cache loop + Python envs", False),
    # torch.compile takes about a minute on a CPU, and made decoding slower
    # there.
    *(
      []
      if pair.smoke or pair.replies == "long"
      else [("static", "static-cache loop, torch.compile + Python envs", True)]
    ),
  ]


def rollout_jax(pair: Pair, peak) -> Measured:
  setup = pair.setup
  play = jax.jit(
    lambda p, codec, k: rollout_lib.rollout(
      nnx.merge(pair.policy_def, p), codec, setup.env, setup.config.rollout, k
    )
  )
  keys = iter(range(1, 1000))
  out = {}

  def run():
    out["traj"] = jax.block_until_ready(
      play(pair.state.policy, setup.codec, jax.random.key(next(keys)))
    )

  def finish(t: Timing) -> dict[str, Any]:
    return _rollout_row(pair, peak, out["traj"], t)

  return Measured(run, finish)


def _rollout_row(pair: Pair, peak, traj, t: Timing) -> dict[str, Any]:
  setup, cfg, seconds = pair.setup, pair.model_cfg, t.seconds
  generated = float(np.sum(traj.response_lengths))
  lengths = np.asarray(traj.length, np.float64)
  flops = forward_flops(
    cfg,
    float(np.sum(lengths)),
    generated + setup.config.rollout.max_turns * setup.config.rollout.batch,
    float(np.sum(lengths * (lengths + 1) / 2)),
  )
  # Decoding reads every weight once per step for the whole batch, and each
  # token reads its episode's keys and values so far.
  size = jnp.dtype(cfg.dtype).itemsize
  param_bytes = size * cfg.num_params()
  kv_bytes = 2 * size * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
  steps = generated / setup.config.rollout.batch
  moved = (
    steps * param_bytes + generated * float(np.mean(lengths)) / 2 * kv_bytes
  )
  waste = diagnostics.decode_waste(traj)
  return dict(
    suite="rollout",
    workload=pair.describe(),
    metric="generated tokens/s",
    jax=generated / seconds,
    # The last rollout's decode slots that made no token (diagnostics).
    **{k: float(v) for k, v in waste.items()},
    compile_s=t.first - seconds,
    peak_gib=t.peak_gib,
    flops_frac=flops / seconds / peak["matmul_flops"],
    bandwidth_frac=moved / seconds / peak["bandwidth"],
    recompiled=t.recompiled,
  )


def rollout_torch(pair: Pair, repeats: int) -> list[dict[str, Any]]:
  rates = []
  for kind, label, compile in rollout_baselines(pair):
    loop = pair.torch_loop(kind, compile)
    counts = []
    (t,) = timed_together(
      [
        lambda loop=loop, counts=counts: counts.append(
          loop.rollout().generated_tokens
        )
      ],
      repeats,
    )
    rates.append(torch_rate(label, float(np.mean(counts[1:])) / t.seconds, t))
  return rates


def update_batch(pair: Pair) -> dict[str, np.ndarray]:
  """A minibatch of the training shape where every generated token
  trains, the same on both sides (seeded)."""
  setup, r = pair.setup, pair.setup.config.rollout
  mb = r.batch // setup.config.algo.minibatches
  length, gen = r.max_context, r.max_generated
  rng = np.random.default_rng(0)
  vocab = setup.tokenizer.vocab_size
  tokens = rng.integers(0, vocab, (mb, length)).astype(np.int32)
  positions = np.sort(
    np.stack(
      [rng.choice(np.arange(1, length), gen, replace=False) for _ in range(mb)]
    ),
    axis=1,
  ).astype(np.int32)
  if pair.allowed is not None:
    # Generated tokens are ones the policy may emit.
    ok = np.flatnonzero(pair.allowed)
    np.put_along_axis(tokens, positions, rng.choice(ok, positions.shape), 1)
  return dict(
    tokens=tokens,
    positions=positions,
    old_logp=-rng.uniform(0.5, 3.0, (mb, gen)).astype(np.float32),
    adv=rng.normal(size=(mb, gen)).astype(np.float32),
  )


def update_workload(pair: Pair) -> str:
  r = pair.setup.config.rollout
  mb = r.batch // pair.setup.config.algo.minibatches
  return (
    f"{pair.name} ({pair.dtype}), minibatch {mb} x {r.max_context} tokens "
    f"({r.max_generated} scored)"
  )


UPDATE_BASELINE = "same loss in PyTorch (AdamW)"


def _batch(data: dict[str, np.ndarray]) -> batch_lib.Batch:
  """``update_batch``'s arrays as the JAX update's batch: every generated
  token trains, no critic and no reference."""
  mb, gen = data["positions"].shape
  zeros = jnp.zeros((mb, gen), jnp.float32)
  return batch_lib.Batch(
    tokens=jnp.asarray(data["tokens"]),
    # The whole context is seen (rollout.context_window="full").
    turns=jnp.zeros(data["tokens"].shape, jnp.int32),
    positions=jnp.asarray(data["positions"]),
    mask=jnp.ones((mb, gen), bool),
    old_logp=jnp.asarray(data["old_logp"]),
    ref_logp=zeros,
    advantages=jnp.asarray(data["adv"]),
    returns=zeros,
    values=zeros,
    episode=jnp.arange(mb, dtype=jnp.int32),
  )


def update_jax(pair: Pair, peak) -> Measured:
  setup, cfg, algo = pair.setup, pair.model_cfg, pair.setup.config.algo
  data = update_batch(pair)
  mb, length = data["tokens"].shape
  gen = data["positions"].shape[1]
  dist = spec_lib.Distribution(
    setup.config.rollout.temperature, setup.codec.allowed
  )

  def loss_fn(params, batch):
    # The step's own objective, on a batch where every token trains.
    return update_lib.policy_objective(
      params, pair.policy_def, batch, algo, dist
    )[0]

  def update_fn(params, opt, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt = pair.learner.policy_tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss

  # Outputs keep the inputs' shardings, so the next call does not recompile.
  shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
  placed = (shardings(pair.state.policy), shardings(pair.state.policy_opt))
  update = jax.jit(
    update_fn,
    donate_argnums=(0, 1),
    in_shardings=(*placed, None),
    out_shardings=(*placed, None),
  )
  batch = _batch(data)
  # Donated: each suite has a Pair of its own.
  carry = {"params": pair.state.policy, "opt": pair.state.policy_opt}

  def run():
    p, o, loss = update(carry["params"], carry["opt"], batch)
    jax.block_until_ready(loss)
    carry.update(params=p, opt=o)

  trained = mb * length
  flops = 3 * forward_flops(
    cfg, trained, mb * gen, mb * length * (length + 1) / 2
  )

  def finish(t: Timing) -> dict[str, Any]:
    return dict(
      suite="update",
      workload=update_workload(pair),
      metric="trained tokens/s",
      jax=trained / t.seconds,
      compile_s=t.first - t.seconds,
      peak_gib=t.peak_gib,
      flops_frac=flops / t.seconds / peak["matmul_flops"],
      recompiled=t.recompiled,
    )

  return Measured(run, finish)


def update_torch(pair: Pair, repeats: int) -> list[tuple[str, float]]:
  import torch

  from benchmarks.compare.pytorch import starpo as tb

  data = update_batch(pair)
  mb, length = data["tokens"].shape
  gen = data["positions"].shape[1]
  opt = tb.optimizer(pair.torch_model, pair.torch_cfg)
  dev = tb.model_device(pair.torch_model)
  t_allowed = None if pair.allowed is None else torch.as_tensor(pair.allowed)
  t_allowed = None if t_allowed is None else t_allowed.to(dev)
  pick = dict(
    tokens=torch.as_tensor(data["tokens"]).long(),
    attention_mask=torch.ones(mb, length, dtype=torch.long),
    positions=torch.as_tensor(data["positions"]).long(),
    old_logp=torch.as_tensor(data["old_logp"]),
    adv=torch.as_tensor(data["adv"]),
    mask=torch.ones(mb, gen, dtype=torch.bool),
  )
  pick = {k: v.to(dev) for k, v in pick.items()}
  pair.torch_model.train()
  (t,) = timed_together(
    [
      lambda: tb.minibatch_step(
        pair.torch_model, opt, pick, pair.torch_cfg, t_allowed
      )
    ],
    repeats,
  )
  return [torch_rate(UPDATE_BASELINE, mb * length / t.seconds, t)]


ITERATION_BASELINES = (
  ("dynamic", "torch_baseline: generate + Python envs"),
  ("static", "torch_baseline: static-cache loop"),
)


def iteration_jax(pair: Pair, peak) -> Measured:
  setup = pair.setup
  step = assembly.compile_step(setup, pair.state, pair.learner)
  holder = {"state": pair.state}
  tokens = []

  def run():
    holder["state"], m = step(holder["state"], setup.codec)
    tokens.append(float(jax.block_until_ready(m["rollout/generated_tokens"])))

  def finish(t: Timing) -> dict[str, Any]:
    return dict(
      suite="iteration",
      workload=pair.describe(),
      metric="iterations/s",
      jax=1 / t.seconds,
      compile_s=t.first - t.seconds,
      peak_gib=t.peak_gib,
      recompiled=t.recompiled,
      jax_tokens=float(np.mean(tokens[1:])),
    )

  return Measured(run, finish)


def iteration_torch(pair: Pair, repeats: int) -> list[dict[str, Any]]:
  rates = []
  # Uncompiled: torch.compile made a CPU's decoding slower (the rollout
  # rows).
  for kind, label in ITERATION_BASELINES:
    loop = pair.torch_loop(kind)
    (t,) = timed_together([loop.iteration], repeats)
    del loop  # its optimizer state
    rates.append(torch_rate(label, 1 / t.seconds, t))
  return rates


SIDES = {
  "rollout": (rollout_jax, rollout_torch),
  "update": (update_jax, update_torch),
  "iteration": (iteration_jax, iteration_torch),
  "attention": (kernels.jax_side("attention"), kernels.torch_side("attention")),
  "head": (kernels.jax_side("head"), kernels.torch_side("head")),
}
