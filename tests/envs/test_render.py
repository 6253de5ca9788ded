"""envs/jax/render.py: each piece's limit in one observation, which fixes a
tokenizer's observation budget (``EnvSpec.piece_limits``)."""

from __future__ import annotations

import numpy as np
import pytest

import envs
from tests.envs.conftest import NUM_LEVELS, level_pool, play


@pytest.mark.parametrize("name", ["frozen_lake", "sokoban"])
@pytest.mark.parametrize("mode", ["grid", "coord", "grid_coord"])
def test_no_observation_uses_a_piece_more_often_than_its_limit(name, mode):
  env = envs.make(name, render_mode=mode)
  limits = np.asarray(env.spec.piece_limits)
  assert limits.shape == (len(env.spec.pieces),)
  actions = np.random.default_rng(0).integers(0, 4, (NUM_LEVELS, 4))
  out = play(env, level_pool(name), actions.astype(np.int32))
  pieces = np.concatenate([out["pieces0"][:, None], out["pieces"]], axis=1)
  n = np.concatenate([out["n0"][:, None], out["n"]], axis=1)
  pieces, n = pieces.reshape(-1, pieces.shape[-1]), n.reshape(-1)
  used = np.arange(pieces.shape[1])[None] < n[:, None]
  most = np.zeros_like(limits)
  for ids, keep in zip(pieces, used, strict=True):
    counts = np.bincount(ids[keep], minlength=len(limits))
    most = np.maximum(most, counts)
  assert np.all(most <= limits), [
    (env.spec.pieces[i], int(most[i]), int(limits[i]))
    for i in np.flatnonzero(most > limits)
  ]
  # Titles, the board-size header and the coord labels appear once in
  # every render that has them: their limit is reached, not just bounded.
  once = [i for i, p in enumerate(env.spec.pieces) if p.strip().endswith(":")]
  once += [i for i, p in enumerate(env.spec.pieces) if p.startswith("Board")]
  assert (mode == "grid") == (not once)
  assert all(most[i] == limits[i] == 1 for i in once), [
    (env.spec.pieces[i], int(most[i]), int(limits[i])) for i in once
  ]
  # A full board: every cell drawn, so each cell's symbol is bounded by
  # the cell count and the rows' newlines by rows - 1.
  if mode != "coord":
    newline = env.spec.pieces.index("\n")
    assert most[newline] == limits[newline]
