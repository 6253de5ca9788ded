"""What a benchmark row runs and how it is timed: the workload (the
training config at a size, its model on both sides, ``Pair``), the
machine's roofline, compile counting and peak memory."""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from configs import sokoban
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.models import checkpoints, hf
from starpo_jax.models import config as model_config
from starpo_jax.run import assembly


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


@dataclasses.dataclass(frozen=True)
class Timing:
  """One measured call's times: the first (warm-up) call's seconds, the
  median of the rest, whether any of the rest compiled, and the process's
  peak resident memory (GiB) while its calls ran."""

  first: float
  seconds: float
  recompiled: bool
  peak_gib: float


def timed_together(
  fns: Sequence[Callable[[], Any]], repeats: int
) -> list[Timing]:
  """Times several calls against each other: each warms up once, then the
  calls take turns, ``repeats`` rounds, so a machine's slow spell falls on
  all of them alike rather than on whichever ran then."""
  firsts, peaks = [], [0.0] * len(fns)
  times: list[list[float]] = [[] for _ in fns]
  recompiled = [False] * len(fns)

  def call(i: int, warm_up: bool = False) -> float:
    compiles = _COMPILES[0]
    with PeakMemory() as mem:
      start = time.perf_counter()
      fns[i]()
      seconds = time.perf_counter() - start
    peaks[i] = max(peaks[i], mem.gib)
    if not warm_up:
      recompiled[i] |= _COMPILES[0] > compiles
    return seconds

  for i in range(len(fns)):
    firsts.append(call(i, warm_up=True))
  for _ in range(repeats):
    for i in range(len(fns)):
      times[i].append(call(i))
  return [
    Timing(firsts[i], statistics.median(times[i]), recompiled[i], peaks[i])
    for i in range(len(fns))
  ]


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, bool]:
  """(seconds of the first, warm-up call; median seconds of the rest;
  whether any of the rest compiled)."""
  t = timed_together([fn], repeats)[0]
  return t.first, t.seconds, t.recompiled


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
  # No suite runs the warm start (benchmarks.compare.warm_start times it): its
  # think-mode reference copy would sit in every row's memory for nothing.
  c.sft.steps = 0
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
  _size(c, model, size, replies, packaged)
  return c


def _size(c, model: str, size: str, replies: str, packaged: bool) -> None:
  """The workload's episodes, turns and tokens at ``size`` (``workload``
  says what each size is)."""
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
    # Named by vocabulary too: the tiny model's compact tokenizer grows
    # with think mode, so its short and long workloads are two models.
    vocab = self.model_cfg.vocab_size
    self.model_dir = os.path.join(workdir, f"hf-{model}-{dtype}-{vocab}")
    allowed = self.setup.codec.allowed
    self.allowed = None if allowed is None else np.asarray(allowed)
    self.state = None
    self.torch_model = None

  def init_jax(self, train: bool = True) -> None:
    """The JAX train state; its policy's weights written for PyTorch.
    ``train=False`` keeps the policy alone (a rollout's row holds what
    PyTorch's rollout holds: the model, no optimizer state)."""
    self.state = assembly.init_state(self.setup, self.learner)
    if not train:
      self.state = self.state.replace(
        policy_opt=None, critic=None, critic_opt=None, reference=None
      )
    if self.model_file is None and not os.path.exists(self.model_dir):
      hf.save(nnx.merge(self.policy_def, self.state.policy), self.model_dir)

  def init_torch(self, device: str) -> None:
    """The PyTorch model with the JAX side's weights, in the same dtype,
    with PyTorch's fused attention (SDPA: flash attention on GPUs)."""
    import torch
    import transformers

    from benchmarks.compare.pytorch import starpo as tb

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
    from benchmarks.compare.pytorch import starpo as tb

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
