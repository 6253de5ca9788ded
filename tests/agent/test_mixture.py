"""Several environments in one run (``agent/mixture.py``): a mixture's
rollout is each environment's own rollout, part by part, two jittable
environments and a Python one; its per-environment metrics are those a
plain-Python count over each part's episodes gives; the compiled step
runs on the mixture once compiled; bad mixtures are refused by name."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import mixture as mixture_config
from starpo_jax.agent import mixture
from starpo_jax.agent.rollout import rollout
from starpo_jax.algo import diagnostics
from starpo_jax.algo.step import collect, step_keys
from starpo_jax.run import assembly

PARTS = {
  "sokoban": {"env": "sokoban", "groups": 2},
  "frozen_lake": {"env": "frozen_lake", "groups": 1, "success_rate": 1.0},
  "gym": {"env": "gym_sokoban", "groups": 1, "levels": "sokoban"},
}


def small(parts=PARTS, groups=4):
  c = mixture_config.get_config()
  c.env.mixture = parts
  c.rollout.env_groups = groups
  c.rollout.group_size = 2
  c.rollout.max_turns = 2
  c.algo.minibatches = 1
  c.sft.steps = 0
  return c


@pytest.fixture(scope="module")
def built():
  setup = assembly.build(small())
  learner = assembly.make_learner(setup)
  state = assembly.init_state(setup, learner)
  return setup, learner, state


@pytest.fixture(scope="module")
def first_rollout(built):
  """The first step's rollout of a fresh state, replayed with its key
  (``step_keys``): what the step plays first, as numpy."""
  setup, learner, _ = built
  state = assembly.init_state(setup, learner)
  spec = assembly.step_spec(setup, learner)
  key = step_keys(state)[0]
  traj = collect(spec, state, setup.codec, key)
  return jax.tree.map(np.asarray, traj), key, state


def test_a_mixture_plays_each_environment_as_its_own_rollout(
  built, first_rollout
):
  setup, learner, _ = built
  mixed, key, state = first_rollout  # mixture.play's, as the step plays it
  mix, cfg = setup.env, setup.config.rollout
  assert mix.tags == ("frozen_lake", "gym", "sokoban")  # the tags' order
  model = nnx.merge(learner.policy_def, state.policy)
  rows = mix.rows(cfg.group_size)
  assert [r[1:] for r in rows] == [(0, 2), (2, 4), (4, 8)]
  for i, ((tag, start, stop), part) in enumerate(
    zip(rows, mix.parts, strict=True)
  ):
    own_cfg = dataclasses.replace(cfg, env_groups=part.groups)
    own = rollout(
      model,
      setup.codec.parts[i],
      setup.eval_envs[tag],
      own_cfg,
      jax.random.fold_in(key, i),
    )
    got = mixture.slice_rows(mixed, start, stop)
    for field in ("tokens", "turn_ids", "loss_mask", "success", "turn_actions"):
      np.testing.assert_array_equal(
        getattr(got, field), getattr(own, field), err_msg=f"{tag}.{field}"
      )
    np.testing.assert_allclose(got.logprobs, own.logprobs, atol=1e-6)
    # Each part shows its own environment: Sokoban's walls, the lake's
    # holes.
    text = setup.tokenizer.decode(got.tokens[0][~got.loss_mask[0]])
    assert ("#" in text) == (tag != "frozen_lake"), (tag, text)


def test_per_environment_metrics_count_each_parts_episodes(
  built, first_rollout
):
  setup, learner, state = built
  step = assembly.compile_step(setup, state, learner)
  codec = setup.codec
  traj = first_rollout[0]
  state, metrics = step(state, codec)
  before = step._cache_size()
  step(state, codec)
  assert step._cache_size() == before  # no recompile on a second call
  metrics = {k: float(v) for k, v in metrics.items()}
  for tag, start, stop in setup.env.rows(2):
    success = [bool(traj.success[b]) for b in range(start, stop)]
    ret = [float(traj.episode_return[b]) for b in range(start, stop)]
    turns = [int(sum(traj.turn_played[b])) for b in range(start, stop)]
    assert metrics[f"rollout/{tag}/success"] == pytest.approx(
      sum(success) / len(success)
    )
    assert metrics[f"rollout/{tag}/return"] == pytest.approx(
      sum(ret) / len(ret), abs=1e-5
    )
    assert metrics[f"rollout/{tag}/num_turns"] == pytest.approx(
      sum(turns) / len(turns)
    )
    played = [
      (int(n), bool(ok))
      for b in range(start, stop)
      for n, ok, p in zip(
        traj.response_lengths[b],
        traj.turn_format_ok[b],
        traj.turn_played[b],
        strict=True,
      )
      if p
    ]
    assert metrics[f"rollout/{tag}/response_length"] == pytest.approx(
      sum(n for n, _ in played) / len(played)
    )
    assert metrics[f"rollout/{tag}/format_rate"] == pytest.approx(
      sum(ok for _, ok in played) / len(played)
    )
    assert 0 <= metrics[f"filter/{tag}/kept_ratio"] <= 1
  # Filter shares: the kept groups of all parts are the step's.
  groups = {
    t: p.groups for t, p in zip(setup.env.tags, setup.env.parts, strict=True)
  }
  kept = sum(metrics[f"filter/{t}/kept_ratio"] * g for t, g in groups.items())
  assert kept / setup.env.groups == pytest.approx(metrics["filter/kept_ratio"])


def test_part_metrics_are_nothing_for_one_environment():
  assert diagnostics.part_metrics(object(), None, None, None, 2) == {}


@pytest.mark.parametrize(
  ("parts", "groups", "message"),
  [
    (PARTS, 5, "env_groups=5 must be the mixture's 4 groups"),
    ({"a": {"env": "sokoban"}}, 1, "mixture.a: needs env"),
    ({"a": {"env": "nope", "groups": 1}}, 1, "mixture.a: unknown environment"),
    ({"A": {"env": "sokoban", "groups": 1}}, 1, "mixture.A: a tag is"),
    ({"eval": {"env": "sokoban", "groups": 1}}, 1, "mixture.eval: a tag is"),
  ],
)
def test_a_bad_mixture_is_refused_by_name(parts, groups, message):
  with pytest.raises(assembly.ConfigError, match=message):
    assembly.build(small(parts, groups))


def test_a_python_part_cannot_warm_start():
  c = small()
  c.sft.steps = 1
  with pytest.raises(assembly.ConfigError, match=r"gym_sokoban.*Python"):
    assembly.build(c)


def test_the_mixture_config_holds_every_turn_of_both_environments():
  """configs/mixture.py: the default Sokoban recipe over both
  environments, whose longest episodes fit its context."""
  c = mixture_config.get_config("variants=ragen")
  assert c.sft.steps == 250 and c.train.steps == 200
  setup = assembly.build(c)
  cfg = setup.config.rollout
  assert setup.env.describe() == "frozen_lake x 4 + sokoban x 4"
  assert setup.codec.context_needed(cfg, cfg.max_turns) <= cfg.max_context
  assert {"sokoban_larger", "frozen_lake_6x6"} <= set(setup.eval_envs)


def test_the_benchmarks_parts_are_the_mixtures_parts_alone():
  """``benchmarks.profiling.mixture`` times each part as a run of its own: the
  part's environment, settings and groups, everything else the mixture's."""
  from benchmarks.profiling import mixture as bench

  c = mixture_config.get_config(None)
  parts = dict(bench.parts(c))
  assert list(parts) == ["frozen_lake", "sokoban"]
  built = {tag: assembly.build(p) for tag, p in parts.items()}
  mixed = assembly.build(c)
  for part in mixed.env.parts:
    alone = built[part.tag]
    assert alone.config.rollout.env_groups == part.groups == 4
    assert alone.config.env.mixture == {}
    assert alone.eval_settings["eval"] == mixed.eval_settings[part.tag]
    assert (
      dataclasses.replace(alone.config.rollout, env_groups=8)
      == mixed.config.rollout
    )
    assert alone.config.optim == mixed.config.optim
  with pytest.raises(ValueError, match=r"no env\.mixture"):
    bench.parts(parts["sokoban"])


def test_the_filter_by_part_keeps_each_environments_share(built, first_rollout):
  """By default the filter ranks every group together (RAGEN); with
  ``filter.by_part`` each part keeps its own top groups."""
  from starpo_jax.algo import step as step_lib

  setup, learner, _ = built
  # A state of its own: the step test donates the fixture's.
  state = assembly.init_state(setup, learner)
  spec = assembly.step_spec(setup, learner)
  traj = jax.tree.map(jnp.asarray, first_rollout[0])
  kept = {}
  for by_part in (False, True):
    s = dataclasses.replace(
      spec, filter=dataclasses.replace(spec.filter, by_part=by_part)
    )
    prepared = step_lib.prepare_batch(s, state, setup.codec, traj)
    p = jax.tree.map(np.asarray, prepared.selection)
    kept[by_part] = list(p.keep_group)
    scores = [float(x) for x in p.group_scores]
  # Plain Python: top_k 0.25 keeps max(1, int(0.25 n)) of n groups, the
  # best scores first (the earlier of equal ones).
  assert (spec.filter.strategy, spec.filter.value) == ("top_k", 0.25)

  def top(idx):
    k = max(1, int(0.25 * len(idx)))
    return set(sorted(idx, key=lambda g: (-scores[g], g))[:k])

  everything = top(range(4))
  each = set().union(*(top(range(a, b)) for a, b in ((0, 1), (1, 2), (2, 4))))
  assert kept[False] == [g in everything for g in range(4)]
  assert kept[True] == [g in each for g in range(4)]
  with pytest.raises(assembly.ConfigError, match="by_part"):
    c = mixture_config.get_config()
    c.env.mixture = {}
    c.rollout.env_groups = 4
    c.filter.by_part = True
    assembly.build(c)


def test_a_mixture_run_says_what_it_mixes_and_how_it_ranks(built):
  from starpo_jax.run import train

  setup = built[0]
  lines = train.brief(setup, 1, "runs/x")
  # The parts in their tags' order, the batch's.
  parts = " + ".join(f"{t} x {PARTS[t]['groups']}" for t in sorted(PARTS))
  assert lines[0].startswith(f"mixture of {parts}: 200 RL steps of 8 "), lines
  assert "of all parts ranked together (RAGEN's rule)" in lines[1], lines
  by_part = dataclasses.replace(
    setup.config,
    filter=dataclasses.replace(setup.config.filter, by_part=True),
  )
  lines = train.brief(dataclasses.replace(setup, config=by_part), 1, "x")
  assert "of each part apart (filter.by_part)" in lines[1], lines


def test_the_mixture_config_names_its_parts():
  c = mixture_config.get_config("parts=sokoban+sokoban")
  assert c.env.mixture.to_dict() == {
    "sokoban": {"env": "sokoban", "groups": 4},
    "sokoban_2": {"env": "sokoban", "groups": 4},
  }
  assert assembly.build(c).env.describe() == "sokoban x 4 + sokoban_2 x 4"
  for bad in ("sokoban+chess", "sokoban+sokoban+frozen_lake"):
    with pytest.raises(ValueError, match=r"parts=.*divide 8 groups"):
      mixture_config.get_config(f"parts={bad}")


def test_a_mixture_of_one_part_is_its_environment_alone():
  """The machinery adds nothing of its own: a one-part mixture's warm-start
  and RL steps give the plain run's metrics bit for bit (the part plays
  with the step's key and its own codec), which is what lets a mixture's
  results be read against single-environment runs."""

  def first_steps(parts):
    c = small({"sokoban": {"env": "sokoban", "groups": 2}}, 2)
    if not parts:
      c.env.mixture = {}
    c.sft.steps = 1
    setup = assembly.build(c)
    learner = assembly.make_learner(setup)
    state = assembly.init_state(setup, learner)
    warm = assembly.compile_sft_step(setup, state, learner)
    state, warm_metrics = warm(state, setup.codec)
    rl = assembly.compile_step(setup, state, learner)
    _, rl_metrics = rl(state, setup.codec)
    return {**jax.device_get(warm_metrics), **jax.device_get(rl_metrics)}

  alone, mixed = first_steps(False), first_steps(True)
  assert alone["sft/loss"] > 0 and "rollout/sokoban/success" in mixed
  shared = sorted(set(alone) & set(mixed) - {"time/step"})
  assert len(shared) > 20
  for k in shared:
    np.testing.assert_array_equal(mixed[k], alone[k], err_msg=k)
