"""Shared pieces of the config files: the base config, argument parsing
and the algorithm presets.

A config file's ``get_config(arg)`` receives what follows ``:`` in
``--config=configs/sokoban.py:model=qwen2.5-0.5b,ckpt=/models/qwen``;
``parse_arg`` turns it into a dict over known keys. Any field can then be
overridden with ``--config.rollout.group_size=16`` (unknown keys and wrong
types are rejected by name).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from starpo_jax import settings
from starpo_jax.run import sections

# --config=FILE:key=value,... keys and their defaults.
ARG_DEFAULTS = {"model": "tiny", "ckpt": "", "algo": "starpo_s"}

PRESETS = ("starpo", "starpo_s", "starpo_s2", "grpo", "dapo")


def parse_arg(arg: str | None, **defaults: Any) -> dict[str, Any]:
  """``"model=tiny,ckpt=/p"`` -> ``{"model": "tiny", "ckpt": "/p", ...}``.

  Raises:
    ValueError: for an unknown key or a malformed item, naming it.
  """
  known = {**ARG_DEFAULTS, **defaults}
  out = dict(known)
  if not arg:
    return out
  for item in arg.split(","):
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not key=value")
    key, value = item.split("=", 1)
    if key not in known:
      raise ValueError(
        f"unknown config argument {key!r}; known: {sorted(known)}"
      )
    out[key] = value
  return out


def _section(cls) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(settings.defaults(cls))


def base_config() -> ml_collections.ConfigDict:
  """Every setting with its default (RAGEN's where it has one), taken from
  the dataclass of its section (``starpo_jax/run/sections.py`` names them;
  each documents its settings): one place per default."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  for name, cls in sections.SECTIONS.items():
    c[name] = _section(cls)
  # Which mesh axis shards each logical axis of the parameters.
  c.logical_axis_rules = (
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", "tensor"),
    ("head_dim", None),
  )
  return c


def apply_preset(c: ml_collections.ConfigDict, name: str) -> None:
  """The algorithm presets (RAGEN's StarPO / StarPO-S, GRPO, DAPO)."""
  if name not in PRESETS:
    raise ValueError(f"unknown algo preset {name!r}; known: {PRESETS}")
  c.filter.strategy, c.filter.value = "top_p", 1.0  # keep every group
  if name == "starpo":
    # PPO with a critic, KL to the reference, symmetric clipping.
    c.algo.adv_estimator = "gae"
    c.algo.kl_coef = 0.001
    c.algo.clip_high = 0.2
  elif name in ("starpo_s", "starpo_s2"):
    # RAGEN's stabilised recipe: variance filtering, clip-higher, no KL.
    c.algo.adv_estimator = "gae"
    c.algo.kl_coef = 0.0
    c.algo.clip_high = 0.28
    if name == "starpo_s":
      # RAGEN (V1): the quarter of groups with the largest in-group reward
      # standard deviation (2 of 8 groups).
      c.filter.strategy, c.filter.value = "top_k", 0.25
    else:
      # RAGEN-2's recommendation: groups in order of reward spread until
      # they hold 90% of the summed spread; groups with none never kept.
      c.filter.strategy, c.filter.value = "top_p", 0.9
      c.filter.top_p_mode = "linear"
      c.filter.include_zero = False
  elif name == "grpo":
    c.algo.adv_estimator = "grpo"
    c.algo.kl_coef = 0.001
    c.algo.clip_high = 0.2
  else:
    # DAPO: clip-higher, no KL, token-mean, and dynamic sampling (groups
    # whose rewards are all equal carry no signal and are dropped).
    c.algo.adv_estimator = "grpo"
    c.algo.kl_coef = 0.0
    c.algo.clip_high = 0.28
    c.algo.loss_agg = "token-mean"
    c.filter.include_zero = False


def jumanji_puzzle(
  game: str, arg: str | None, max_context: int, turns: int = 5
) -> ml_collections.ConfigDict:
  """A Jumanji puzzle (``envs/jax/jumanji_text.py``) at RAGEN's multi-turn
  settings: ``turns`` turns of up to 2 actions, 10 an episode. The tiny
  model learns from scratch (no planner to imitate) with a context of
  ``max_context`` tokens."""
  args = parse_arg(arg)
  c = base_config()
  c.env.name = game
  apply_preset(c, args["algo"])
  apply_model(c, args)
  c.rollout.max_turns = turns
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = max_context
    c.sft.steps = 0
    c.train.steps = 100
    c.train.eval_every = 50
    c.train.eval_episodes = 256
  return c


def single_turn(c: ml_collections.ConfigDict, algo: str) -> None:
  """One turn, one answer (Bandit, Countdown). No credit to assign over
  time, so StarPO-S uses group-relative advantages (no critic to train)."""
  c.rollout.max_turns = 1
  c.rollout.max_actions_per_turn = 1
  c.rollout.max_actions_per_traj = 1
  if algo == "starpo_s":
    c.algo.adv_estimator = "grpo"


def smollm2_on_cpu(
  c: ml_collections.ConfigDict,
  *,
  turns: int,
  context: int,
  expert: str,
  rl_steps: int,
  warm_steps: int = 12,
  reasoning_tokens: int = 32,
) -> None:
  """SmolLM2-135M-Instruct sized so that one run (warm start, RL and three
  held-out evaluations) takes about 90 minutes on a 2-core CPU, in
  RAGEN's think format: 32 episodes a step (8 levels x 4) of ``turns``
  turns (RAGEN: 5) of up to 64 new tokens (RAGEN: 100).

  Zero-shot the model answers RAGEN's prompt in the format in 3 to 22% of
  turns and solves 0 to 2.3% of held-out levels, so RL alone sees almost
  no reward spread; a think-mode warm start (``warm_steps`` steps of 16
  first turns: its own reasoning, cut at ``reasoning_tokens``, then
  ``expert``'s answer) teaches it to close its reasoning and answer
  (docs/results.md, "A pretrained model that reasons").
  """
  r = c.rollout
  r.env_groups, r.group_size = 8, 4
  r.max_turns = turns
  r.max_new_tokens = 64
  r.max_context = context
  c.sft.steps = warm_steps
  c.sft.episodes = 16
  c.sft.lr = 5e-5
  c.sft.expert = expert
  c.sft.reasoning_tokens = reasoning_tokens
  c.train.steps = rl_steps
  c.optim.lr = 1e-5
  # Zero-shot, after the warm start, at the end: 128 levels at RAGEN's
  # temperature (each evaluation costs about a RL step per 10 levels).
  c.train.eval_every = c.sft.steps + rl_steps
  c.train.eval_episodes = 128
  c.train.eval_temperatures = (0.5,)
  c.train.checkpoint_every = 4
  c.diagnostics.collapse_every = 10


def apply_model(c: ml_collections.ConfigDict, args: dict[str, Any]) -> None:
  """``model=`` / ``ckpt=`` arguments, with settings fit for each model."""
  c.model.preset = args["model"]
  c.model.ckpt = args["ckpt"]
  if args["model"] == "tiny":
    # A model trained from scratch has no language: it answers with actions
    # only, from the tokens answers are made of, and learns fast enough on a
    # CPU with a larger learning rate.
    c.rollout.enable_think = False
    c.rollout.answer_vocab = True
    c.rollout.prompt = "compact"
    c.optim.lr = 1e-3
    c.optim.critic_lr = 1e-3
    c.optim.weight_decay = 0.0
    # Each episode weighs the same whatever its length.
    c.algo.loss_agg = "seq-mean-token-mean"
    # One update length: its episodes nearly fill the trimmed contexts, so
    # a shorter bucket would never run, and each costs a compile.
    c.algo.length_buckets = 1
    if args["algo"] in ("starpo_s", "starpo_s2"):
      # NOT the preset's critic: StarPO-S's filter, clipping and KL with
      # group-relative advantages (GRPO) for the tiny model; the run's
      # first lines say so ("algorithm: grpo advantages"). Why:
      # docs/results.md, "Why these settings".
      c.algo.adv_estimator = "grpo"
  elif args["model"] == "smollm2-135m":
    # A pretrained 135M model sized for a CPU: float32 (XLA:CPU computes
    # bfloat16 matmuls no faster), whole layers recomputed in the backward
    # pass (faster here than keeping them: 131 against 153 s a FrozenLake
    # step, and 16 GB less).
    c.model.remat = "full"
    # Group-relative advantages: a critic would be a second 135M model to
    # run and train on two cores. The comparison between presets is of
    # what StarPO-S changes (filter, clipping, KL), the same for both.
    c.algo.adv_estimator = "grpo"
  else:
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "bfloat16"
    c.model.remat = "full"
