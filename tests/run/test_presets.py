"""The algorithm presets do what their names promise."""

from __future__ import annotations

import importlib

import jax.numpy as jnp
import numpy as np
import pytest

from configs import frozen_lake, sokoban
from starpo_jax.agent import rollout
from starpo_jax.algo import filtering
from starpo_jax.run import assembly, presets

# In-group reward standard deviations of eight hand-made groups.
SPREAD = [0.0, 0.5, 3.0, 0.0, 1.0, 2.0, 0.25, 0.0]
EQUAL = [1.0] * 8
NONE = [0.0] * 8


def kept(preset: str, scores: list[float]) -> set[int]:
  config = sokoban.get_config(f"algo={preset}")
  cfg = filtering.FilterConfig(**config.filter)
  keep = filtering.keep_groups(jnp.asarray(scores, jnp.float32), cfg)
  return set(np.flatnonzero(np.asarray(keep)).tolist())


@pytest.mark.parametrize(
  "preset, scores, want",
  [
    # StarPO and GRPO train on every group.
    ("starpo", SPREAD, set(range(8))),
    ("starpo", NONE, set(range(8))),
    ("grpo", SPREAD, set(range(8))),
    # StarPO-S (RAGEN V1): the top quarter of groups by reward spread.
    ("starpo_s", SPREAD, {2, 5}),
    ("starpo_s", EQUAL, {0, 1}),
    ("starpo_s", NONE, {0, 1}),
    # RAGEN-2: largest spreads until 90% of the summed spread (6.75 here:
    # 3 + 2 + 1 + 0.5 = 6.5 reaches 0.9 x 6.75), never a group with none.
    ("starpo_s2", SPREAD, {1, 2, 4, 5}),
    ("starpo_s2", EQUAL, set(range(8))),
    ("starpo_s2", NONE, set()),
    # DAPO's dynamic sampling: every group with any spread.
    ("dapo", SPREAD, {1, 2, 4, 5, 6}),
    ("dapo", NONE, set()),
  ],
)
def test_presets_keep_the_groups_their_names_promise(preset, scores, want):
  assert kept(preset, scores) == want


def test_every_preset_is_pinned():
  tested = {"starpo", "starpo_s", "starpo_s2", "grpo", "dapo"}
  assert set(presets.ALGORITHMS) == tested


def test_starpo_s_drops_the_kl_term_and_clips_higher():
  c = sokoban.get_config("algo=starpo_s")
  assert c.algo.kl_coef == 0.0
  assert c.algo.clip_high > c.algo.clip_low
  s = sokoban.get_config("algo=starpo")
  assert s.algo.kl_coef > 0 and s.algo.clip_high == s.algo.clip_low


@pytest.mark.parametrize(
  "name, arg, env", [("countdown", None, "countdown"),
                     ("sudoku", None, "sudoku_easy"),
                     ("sudoku_4x4", None, "sudoku_4x4"),
                     ("game2048", None, "game2048"),
                     ("rubiks_cube", None, "rubiks_cube_2x2"),
                     ("qa", None, "qa"),
                     ("countdown", "tools=calculator", "countdown"),
                     ("qa", "tools=calculator", "qa"),
                     ("gymnasium", None, "gymnasium")],
)  # fmt: skip
def test_new_environment_configs_build(name, arg, env):
  """Each config builds its environment, tokenizer and codec (the README's
  short runs show they train); the tiny model's context holds every turn."""
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  setup = assembly.build(config)
  assert setup.env.spec.name == env
  cfg = setup.config.rollout
  need = rollout.context_needed(setup.codec, cfg, cfg.max_turns)
  assert need <= cfg.max_context, (need, cfg.max_context)


def test_frozen_lakes_config_arguments_pick_ragen2s_prompt_and_coordinates():
  plain = assembly.build(frozen_lake.get_config(None)).env.jittable
  c = frozen_lake.get_config("instructions=ragen2,render=grid_coord")
  env = assembly.build(c).env.jittable
  assert "<think>" in plain.spec.instructions
  assert "<think>" not in env.spec.instructions
  assert "Coordinates" in "".join(env.spec.pieces)
  assert "Coordinates" not in "".join(plain.spec.pieces)
