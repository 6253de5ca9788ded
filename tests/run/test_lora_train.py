"""Training LoRA adapters: only they change and have optimizer state, the
frozen weights are the reference (KL 0 at the start), the step compiles
once, a run starts from a run without adapters, and the warm start is
refused with them. Checkpoints hold the adapters and their base's digest:
a run resumes bit for bit, adapters on other weights are refused, and an
adapter run evaluates and exports its merged policy."""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import bandit
from starpo_jax import sharding
from starpo_jax.cli import hf as hf_cli
from starpo_jax.models import hf, lora, transformer
from starpo_jax.run import assembly, checkpoint, evaluator, train
from starpo_jax.run.assembly import compiled as compiled_steps
from tests.helpers import traced_at_most_once


def config(**lora_settings):
  c = bandit.get_config("")
  c.rollout.env_groups, c.rollout.group_size = 2, 4
  c.algo.minibatches = 2
  c.algo.kl_coef = 0.01  # a reference policy, and the KL in the loss
  c.algo.adv_estimator = "gae"  # and a critic
  c.filter.value = 1.0
  c.sft.steps = 0
  c.train.eval_every = 0
  c.model.lora.rank = 4
  c.optim.lr = 1e-2
  for k, v in lora_settings.items():
    c.model.lora[k] = v
  return c


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_only_adapters_train_and_the_base_is_the_reference():
  # The config trains a critic (GAE) too.
  setup = assembly.build(config())
  learner = assembly.make_learner(setup)
  assert learner.adapters
  state = assembly.init_state(setup, learner)
  assert state.reference is None  # no copy of the weights
  adapters, weights = state.policy.split(nnx.LoRAParam, ...)
  # Adam's two moments, each shaped like the adapters only.
  shapes = sorted(x.shape for x in jax.tree.leaves(adapters))
  moments = sorted(
    x.shape for x in jax.tree.leaves(state.policy_opt) if x.ndim > 0
  )
  assert moments == sorted(shapes * 2)
  before_w, before_a = leaves(weights), leaves(adapters)
  # The critic: adapters and a value head on the same frozen weights (no
  # second model, nor moments for one).
  assert learner.critic_shares_base
  own = flat(nnx.to_pure_dict(state.critic))
  assert len(own) == 14 + 2
  assert all("_lora_" in k or "value_" in k for k in own), list(own)
  moments = sorted(
    x.shape for x in jax.tree.leaves(state.critic_opt) if x.ndim > 0
  )
  assert moments == sorted([v.shape for v in own.values() if v.ndim] * 2)
  before_c = leaves(state.critic)
  codec = sharding.replicate(setup.codec, setup.mesh)
  with traced_at_most_once(compiled_steps, "make_step"):
    step = assembly.compile_step(setup, state, learner)
    state, first = step(state, codec)
    for _ in range(2):
      state, metrics = step(state, codec)
  adapters, weights = state.policy.split(nnx.LoRAParam, ...)
  # The frozen weights bit for bit; every adapter moved.
  for a, b in zip(before_w, leaves(weights), strict=True):
    np.testing.assert_array_equal(a, b)
  assert all(
    not np.array_equal(a, b)
    for a, b in zip(before_a, leaves(adapters), strict=True)
  )
  # The critic trained its own adapters and value head, all it holds.
  assert all(
    not np.array_equal(a, b)
    for a, b in zip(before_c, leaves(state.critic), strict=True)
  )
  # New adapters (B = 0) play the frozen weights' policy: the rollout's KL
  # to the reference is 0 exactly, and only then.
  assert float(first["rollout/kl_to_reference"]) == 0.0
  assert float(metrics["rollout/kl_to_reference"]) != 0.0


def test_adapters_sit_on_a_hugging_face_checkpoints_weights(tmp_path):
  # A checkpoint written from a model of the setup's shape (and its
  # tokenizer): the policy holds its weights, new adapters beside them.
  c = config()
  setup = assembly.build(c)
  plain = setup.model_cfg.replace(lora=None)
  saved = transformer.create(plain, seed=7)
  hf.save(saved, str(tmp_path))
  setup.tokenizer.save(str(tmp_path))
  c.model.ckpt = str(tmp_path)
  setup = assembly.build(c)
  policy = assembly.init_state(setup, assembly.make_learner(setup)).policy
  weights = flat(nnx.to_pure_dict(policy.filter(lora.WEIGHTS)))
  want = flat(nnx.to_pure_dict(nnx.state(saved)))
  assert weights.keys() == want.keys()
  for k, v in want.items():
    np.testing.assert_array_equal(weights[k], v)
  assert len(flat(nnx.to_pure_dict(policy.filter(nnx.LoRAParam)))) == 14


def test_a_qlora_run_trains_adapters_on_quantized_weights(runs, tmp_path):
  # Started from a run without adapters: its float weights quantized
  # (nf4), new adapters; the quantized weights stay bit for bit, and the
  # checkpoint holds the adapters and the quantized base's digest (the
  # export of a QLoRA model: tests/models/test_lora.py).
  first, _, _ = runs
  c = config(quantize="nf4", tile_size=16)
  c.train.init_from = first
  c.train.steps = 1
  setup = assembly.build(c)
  state = assembly.init_state(setup, assembly.make_learner(setup))
  state = assembly.policy_from(state, setup, first)
  weights = flat(nnx.to_pure_dict(state.policy.filter(lora.WEIGHTS)))
  q = [k for k in weights if k.endswith("['qvalue']")]
  assert len(q) == 7 and all(weights[k].dtype == "uint4" for k in q)
  workdir = tmp_path / "qlora"
  train.run(c, str(workdir))
  params = flat(assembly.final_params(str(workdir), c))
  for k, v in weights.items():
    np.testing.assert_array_equal(params[k], v)
  _, saved, base = checkpoint.load_policy(str(workdir))
  assert len(flat(saved)) == 14
  assert base == assembly.base_of(setup, state.policy.filter(lora.WEIGHTS))
  # The adapters moved from where they started.
  start = flat(nnx.to_pure_dict(state.policy.filter(nnx.LoRAParam)))
  assert start.keys() == flat(saved).keys()
  assert not same(saved, nnx.to_pure_dict(state.policy.filter(nnx.LoRAParam)))


def test_a_full_critic_is_a_whole_model_trained_whole():
  c = config()
  c.model.lora.critic = "full"
  setup = assembly.build(c)
  learner = assembly.make_learner(setup)
  assert learner.adapters and not learner.critic_shares_base
  state = assembly.abstract_state(setup, learner)
  names = lambda tree: {
    jax.tree_util.keystr(p)
    for p, _ in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(tree))
  }
  critic = names(state.critic)
  assert not any("_lora_" in k for k in critic)
  assert names(state.policy.filter(lora.WEIGHTS)) < critic
  c.model.lora.critic = "lora"
  with pytest.raises(assembly.ConfigError, match=r"model\.lora: critic='lora'"):
    assembly.build(c)


def test_the_warm_start_is_refused_with_adapters():
  c = config()
  c.sft.steps = 5
  with pytest.raises(
    assembly.ConfigError, match=r"config\.model\.lora\.rank=\d+: the warm start"
  ):
    assembly.build(c)


def test_bad_adapter_settings_are_named_before_compiling():
  with pytest.raises(
    assembly.ConfigError, match=r"config\.model\.lora: targets=.ffn."
  ):
    assembly.build(config(targets="ffn"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A one-step run without adapters, and a two-step LoRA run started from
  it with a checkpoint after each step."""
  full = bandit.get_config("")
  full.rollout.env_groups, full.rollout.group_size = 2, 4
  full.algo.minibatches = 2
  full.sft.steps, full.train.steps = 0, 1
  full.train.eval_every = 0
  first = str(tmp_path_factory.mktemp("full"))
  train.run(full, first)
  c = config()
  c.train.init_from = first
  c.train.steps = 2
  c.train.checkpoint_every = 1
  workdir = str(tmp_path_factory.mktemp("lora"))
  train.run(c, workdir)
  return first, workdir, c


def flat(tree) -> dict[str, np.ndarray]:
  return {
    jax.tree_util.keystr(path): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(tree)
  }


def same(a, b) -> bool:
  a, b = flat(a), flat(b)
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_run_starts_from_a_run_without_adapters(runs):
  # Its frozen weights are that run's policy; its adapters its own.
  first, workdir, c = runs
  _, full = checkpoint.load_policy(first)[:2]
  params = flat(assembly.final_params(workdir, c))
  for k, v in flat(full).items():
    np.testing.assert_array_equal(params[k], v)
  assert len(params) == len(flat(full)) + 14


def test_checkpoints_hold_the_adapters_and_resume_bit_for_bit(
  runs, tmp_path, capsys
):
  first, workdir, c = runs
  step, saved, base = checkpoint.load_policy(workdir)
  names = list(flat(saved))
  assert step == 2 and len(names) == 14
  assert all(n.endswith(("_lora_a']", "_lora_b']")) for n in names), names
  setup = assembly.build(c)
  _, weights = assembly.load_policy(setup, first, weights_only=True)
  assert base == assembly.base_of(setup, weights)
  assert base["source"] == f"the policy of run {first}"
  # Resumed from step 1: the same policy as the run that went straight on,
  # its adapters on the same frozen weights.
  resumed = tmp_path / "resumed"
  shutil.copytree(workdir, resumed)
  shutil.rmtree(resumed / "checkpoints" / "2")
  capsys.readouterr()
  train.run(c, str(resumed))
  assert "resumed from step 1" in capsys.readouterr().out
  a = assembly.final_params(workdir, c)
  assert same(a, assembly.final_params(str(resumed), c))
  # Its adapters are the checkpoint's.
  a = flat(a)
  for k, v in flat(saved).items():
    np.testing.assert_array_equal(a[k], v)


def test_adapters_on_other_weights_are_refused_and_nothing_is_lost(
  runs, tmp_path
):
  first, workdir, _ = runs
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  before = (copy / "config.json").read_text()
  other = config()  # random weights under the adapters
  with pytest.raises(
    assembly.ConfigError,
    match=rf"trained on the policy of run {first} \(base digest \w+\), but "
    rf"this run's base, the model created from seed {other.seed}, has digest",
  ):
    train.run(other, str(copy))
  with pytest.raises(assembly.ConfigError, match="base digest"):
    evaluator.evaluate_checkpoint(other, workdir, episodes=4)
  full = config()
  full.model.lora.rank = 0
  full.train.init_from = first
  with pytest.raises(assembly.ConfigError, match="holds LoRA adapters"):
    train.run(full, str(copy))
  assert (copy / "config.json").read_text() == before
  assert sorted(os.listdir(copy / "checkpoints")) == ["1", "2"]
  # Nor do a run's adapters start another run as whole weights.
  c2 = config()
  c2.train.init_from = workdir
  with pytest.raises(
    assembly.ConfigError, match=r"init_from=.*holds LoRA adapters .*not whole"
  ):
    train.run(c2, str(tmp_path / "new"))


def test_an_adapter_run_evaluates_and_exports_its_merged_policy(
  runs, tmp_path, capsys
):
  from tests.models.conftest import torch_logits

  _, workdir, c = runs
  summary = evaluator.evaluate_checkpoint(
    c, workdir, episodes=8, temperatures=(0.0,), transcripts=1
  )
  assert summary["step"] == 2 and summary["envs"]
  out = str(tmp_path / "hf")
  assert hf_cli.main(["export", workdir, out]) == 0
  printed = capsys.readouterr().out
  assert float(printed.split("max_abs_logit_diff:")[1].split()[0]) < 1e-4
  # transformers, on the export, gives the adapted policy's logits, not
  # the frozen weights'.
  setup = assembly.build(c)
  policy_def = assembly.make_learner(setup).policy_def
  _, policy = assembly.load_policy(setup, workdir)
  adapted = nnx.merge(policy_def, policy)
  vocab = adapted.cfg.vocab_size
  tokens = np.arange(32).reshape(2, 16) * 7 % vocab
  ours = np.asarray(adapted(jnp.asarray(tokens))[0])
  np.testing.assert_allclose(torch_logits(out, tokens), ours, atol=1e-4)
  adapters, weights = policy.split(nnx.LoRAParam, ...)
  zeroed = jax.tree.map(jnp.zeros_like, adapters)
  base = nnx.merge(policy_def, nnx.merge_state(zeroed, weights))
  assert np.abs(np.asarray(base(jnp.asarray(tokens))[0]) - ours).max() > 1e-3
