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
from starpo_jax.run import presets, sections

# --config=FILE:key=value,... keys and their defaults.
ARG_DEFAULTS = {"model": "tiny", "ckpt": "", "algo": "starpo_s", "variants": ""}


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
        f"unknown config argument {key!r}{settings.nearest(key, known)}; "
        f"known: {sorted(known)}"
      )
    out[key] = value
  return out


def base_config() -> ml_collections.ConfigDict:
  """Every setting with its default (RAGEN's where it has one), taken from
  the dataclass of its section (``starpo_jax/run/sections.py``'s
  ``RunConfig`` names them; each documents its settings): one place per
  default."""
  return ml_collections.ConfigDict(settings.defaults(sections.RunConfig))


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
  apply_presets(c, args)
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
  if algo == "starpo_s" and "grpo_advantages" not in c.presets:
    presets.apply(c, "grpo_advantages")


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


def apply_presets(c: ml_collections.ConfigDict, args: dict[str, Any]) -> None:
  """The ``algo=`` preset, then the ``model=`` one (``run/presets.py``),
  the model's ``ckpt=``, and ``variants=ragen``: RAGEN's validation
  variants of the environment, each evaluated beside it
  (``presets.EVAL_VARIANTS``). StarPO-S on the tiny model, and any
  algorithm on SmolLM2, take group-relative advantages for the critic's
  (the run's first lines say so)."""
  model, algo = args["model"], args["algo"]
  if algo not in presets.ALGORITHMS:
    raise ValueError(
      f"unknown algo preset {algo!r}"
      f"{settings.nearest(algo, presets.ALGORITHMS)}; "
      f"known: {tuple(presets.ALGORITHMS)}"
    )
  presets.apply(c, algo, model)
  if (model == "tiny" and algo in ("starpo_s", "starpo_s2")) or (
    model == "smollm2-135m"
  ):
    presets.apply(c, "grpo_advantages")
  c.model.preset = model
  c.model.ckpt = args["ckpt"]
  if args["variants"]:
    presets.apply(c, presets.variants_preset(c.env.name, args["variants"]))
