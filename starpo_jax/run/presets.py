"""Presets: named tables of settings that a config file applies, in order
(an algorithm's, then a model's), all in one place.

``apply(config, *names)`` writes each table's settings into the config
and records the names in ``config.presets``; ``notes(run)`` reads a parsed
run back against them and says, one line each, where a later preset
replaced an earlier one's setting and where an explicit setting (in the
config file after the presets, or on the command line) replaced a
preset's. A run prints those lines before it starts: no preset is
overridden silently.
"""

from __future__ import annotations

from typing import Any

from starpo_jax import settings

# RAGEN's algorithms: StarPO (PPO with a critic, KL to the reference),
# StarPO-S (variance filtering, clip-higher, no KL), RAGEN-2's StarPO-S
# filter, GRPO, DAPO.
_KEEP_ALL = {"filter.strategy": "top_p", "filter.value": 1.0}
ALGORITHMS: dict[str, dict[str, Any]] = {
  "starpo": {
    **_KEEP_ALL,
    "algo.adv_estimator": "gae",
    "algo.kl_coef": 0.001,
    "algo.clip_high": 0.2,
  },
  # RAGEN (V1): the quarter of groups with the largest in-group reward
  # standard deviation (2 of 8 groups).
  "starpo_s": {
    "algo.adv_estimator": "gae",
    "algo.kl_coef": 0.0,
    "algo.clip_high": 0.28,
    "filter.strategy": "top_k",
    "filter.value": 0.25,
  },
  # RAGEN-2's recommendation: groups in order of reward spread until they
  # hold 90% of the summed spread; groups with none never kept.
  "starpo_s2": {
    "algo.adv_estimator": "gae",
    "algo.kl_coef": 0.0,
    "algo.clip_high": 0.28,
    "filter.strategy": "top_p",
    "filter.value": 0.9,
    "filter.top_p_mode": "linear",
    "filter.include_zero": False,
  },
  "grpo": {
    **_KEEP_ALL,
    "algo.adv_estimator": "grpo",
    "algo.kl_coef": 0.001,
    "algo.clip_high": 0.2,
  },
  # DAPO: clip-higher, no KL, token-mean, and dynamic sampling (groups
  # whose rewards are all equal carry no signal and are dropped).
  "dapo": {
    **_KEEP_ALL,
    "algo.adv_estimator": "grpo",
    "algo.kl_coef": 0.0,
    "algo.clip_high": 0.28,
    "algo.loss_agg": "token-mean",
    "filter.include_zero": False,
  },
}

# What suits each model.
_ACCELERATOR = {
  "model.dtype": "bfloat16",
  "model.param_dtype": "bfloat16",
  "model.remat": "full",
}
MODELS: dict[str, dict[str, Any]] = {
  # A model trained from scratch has no language: it answers with actions
  # only, from the tokens answers are made of, and learns fast enough on a
  # CPU with a larger learning rate. Each episode weighs the same whatever
  # its length; one update length (its episodes nearly fill the trimmed
  # contexts, so a shorter bucket would never run, and each costs a
  # compile).
  "tiny": {
    "rollout.enable_think": False,
    "rollout.answer_vocab": True,
    "rollout.prompt": "compact",
    "optim.lr": 1e-3,
    "optim.critic_lr": 1e-3,
    "optim.weight_decay": 0.0,
    "algo.loss_agg": "seq-mean-token-mean",
    "algo.length_buckets": 1,
  },
  # A pretrained 135M model sized for a CPU: float32 (XLA:CPU computes
  # bfloat16 matmuls no faster), whole layers recomputed in the backward
  # pass (faster here than keeping them: 131 against 153 s a FrozenLake
  # step, and 16 GB less).
  "smollm2-135m": {"model.remat": "full"},
  **{
    name: _ACCELERATOR
    for name in (
      "qwen2.5-0.5b",
      "qwen2.5-1.5b",
      "qwen2.5-3b",
      "qwen2.5-7b",
      "llama-3.2-1b",
      "llama-3.2-3b",
    )
  },
}

# Group-relative advantages in place of a critic, applied after an
# algorithm where a critic does not pay: the tiny model's StarPO-S,
# single-turn tasks, a pretrained model on two cores (docs/results.md,
# "Why these settings").
GRPO_ADVANTAGES = {"algo.adv_estimator": "grpo"}

# RAGEN's validation environments beside the one trained on, as held-out
# variants (``env.eval_variants``); the config argument ``variants=ragen``
# applies the training environment's.
EVAL_VARIANTS: dict[str, dict[str, Any]] = {
  "sokoban_variants": {
    "env.eval_variants": {
      # LargerSokoban: an 8x8 room with two boxes.
      "sokoban_larger": {"dim_room": [8, 8], "num_boxes": 2},
      # SokobanDifferentGridVocab: the same rooms in other symbols.
      "sokoban_vocab": {"symbols": "alternate"},
      "sokoban_two_boxes": {"num_boxes": 2},
    }
  },
  "frozen_lake_variants": {
    "env.eval_variants": {
      "frozen_lake_6x6": {"size": 6},
      # Gym's classic slipperiness (a third of moves go as intended), and
      # none.
      "frozen_lake_slippery": {"success_rate": 1 / 3},
      "frozen_lake_steady": {"success_rate": 1.0},
    }
  },
}

PRESETS: dict[str, dict[str, Any]] = {
  **ALGORITHMS,
  "grpo_advantages": GRPO_ADVANTAGES,
  **MODELS,
  **EVAL_VARIANTS,
}


def apply(config: Any, *names: str) -> None:
  """Writes the presets ``names`` into ``config`` (an
  ``ml_collections.ConfigDict``) in order, and appends them to
  ``config.presets``.

  Raises:
    ValueError: an unknown preset name.
  """
  for name in names:
    if name not in PRESETS:
      raise ValueError(
        f"unknown preset {name!r}{settings.nearest(name, PRESETS)}; "
        f"known: {sorted(PRESETS)}"
      )
    for key, value in PRESETS[name].items():
      section, field = key.split(".")
      config[section][field] = value
  config.presets = (*config.presets, *names)


def variants_preset(env: str, which: str) -> str:
  """The preset of ``which`` validation variants of environment ``env``
  (``variants=ragen``: ``EVAL_VARIANTS``).

  Raises:
    ValueError: naming what exists, for another name or environment.
  """
  named = f"{env}_variants"
  if which != "ragen" or named not in EVAL_VARIANTS:
    raise ValueError(
      f"variants={which!r}: only RAGEN's validation variants "
      f"(variants=ragen), which exist for "
      f"{sorted(n.removesuffix('_variants') for n in EVAL_VARIANTS)}"
    )
  return named


def mixture_variants(parts: dict[str, Any], which: str) -> dict[str, Any]:
  """``which`` validation variants (``variants_preset``) of every
  environment of a mixture (``env.mixture``: tag -> {env, groups,
  settings}), each naming its environment and taking the settings of the
  first part that plays it.

  Raises:
    ValueError: as ``variants_preset`` does, for a part's environment.
  """
  out: dict[str, Any] = {}
  seen = set()
  for entry in parts.values():
    settings = {k: v for k, v in entry.items() if k not in ("env", "groups")}
    name = entry["env"]
    if name in seen:
      continue
    seen.add(name)
    preset = PRESETS[variants_preset(name, which)]["env.eval_variants"]
    for tag, overrides in preset.items():
      out[tag] = {"env": name, **settings, **overrides}
  return out


def _value(run: Any, key: str) -> Any:
  section, field = key.split(".")
  return getattr(getattr(run, section), field)


def notes(run: Any) -> list[str]:
  """Where a preset of ``run.presets`` did not decide a setting: a later
  preset replaced it, or an explicit setting did. One line each."""
  out, last = [], {}
  for name in run.presets:
    for key, value in PRESETS[name].items():
      if key in last and last[key][1] != value:
        out.append(
          f"preset {name} sets {key}={value!r} over preset "
          f"{last[key][0]}'s {last[key][1]!r}"
        )
      last[key] = (name, value)
  for key, (name, value) in last.items():
    if _value(run, key) != value:
      out.append(
        f"config.{key}={_value(run, key)!r} overrides preset {name}'s {value!r}"
      )
  return out
