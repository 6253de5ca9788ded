"""LoRA adapters through qwix on the stacked layers: a new adapter changes
nothing, an adapted model equals the plain model with the adapters folded
into its weights, and bad settings are named. QLoRA: the quantized base
stays within a stated distance of the float one, weights quantized after
loading equal those qwix quantizes itself, and the export folds the
adapters into the dequantized weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax.models import lora
from starpo_jax.models import transformer as T
from starpo_jax.models.config import LoraConfig

CFG = T.ModelConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  num_layers=3,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  qkv_bias=True,
)
TOKENS = jnp.array([[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6]], jnp.int32)


def adapted(targets="attn|mlp", rank=4, alpha=8.0):
  """A base model and the same weights with adapters."""
  base = T.create(CFG, seed=1)
  cfg = CFG.replace(lora=LoraConfig(rank=rank, alpha=alpha, targets=targets))
  model = T.create(cfg, seed=2)
  nnx.update(model, nnx.state(base, lora.WEIGHTS))
  return base, model


def perturb(model, seed: int, scale: float) -> None:
  """Random adapters (new ones, B = 0, change nothing)."""
  adapters = nnx.state(model, nnx.LoRAParam)
  key = iter(jax.random.split(jax.random.key(seed), 64))
  noise = lambda x: scale * jax.random.normal(next(key), x.shape)
  nnx.update(model, jax.tree.map(noise, adapters))


def test_new_adapters_change_nothing_and_sit_on_every_projection():
  base, model = adapted()
  np.testing.assert_array_equal(model(TOKENS)[0], base(TOKENS)[0])
  adapters = nnx.state(model, nnx.LoRAParam)
  flat = {
    "/".join(map(str, path)): v for path, v in nnx.to_flat_state(adapters)
  }
  names = {k.split("/")[-1] for k in flat}
  assert names == {
    f"{p}_lora_{ab}"
    for p in ("q", "k", "v", "o", "gate", "up", "down")
    for ab in "ab"
  }
  # Stacked like the weights: [layers, ...], A random, B zero; sharded by
  # the weight's logical axes with the rank axis unsharded.
  a, b = flat["layers/attn/q_lora_a"], flat["layers/attn/q_lora_b"]
  assert a.shape == (3, 32, 4) and b.shape == (3, 4, 4, 8)
  assert np.all(np.asarray(b[...]) == 0) and np.std(np.asarray(a[...])) > 0
  assert not np.allclose(a[...][0], a[...][1])  # each layer its own
  assert a.out_sharding == ("layers", "embed", None)
  # The base's weights are untouched: the same leaves, still plain Params.
  same = jax.tree.map(
    np.array_equal, nnx.state(model, lora.WEIGHTS), nnx.state(base, nnx.Param)
  )
  assert all(jax.tree.leaves(same))


def test_adapted_logits_equal_the_merged_plain_model():
  base, model = adapted(alpha=6.0)
  perturb(model, seed=0, scale=0.3)
  plain = T.create(CFG, seed=3)
  weights = nnx.state(plain)
  nnx.replace_by_pure_dict(weights, lora.merged(model))
  nnx.update(plain, weights)
  got, want = model(TOKENS)[0], plain(TOKENS)[0]
  assert float(jnp.abs(got - base(TOKENS)[0]).max()) > 1e-2  # they act
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_targets_select_modules():
  _, model = adapted(targets="mlp")
  names = {
    str(path[-1])
    for path, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
  }
  assert names == {
    f"{p}_lora_{ab}" for p in ("gate", "up", "down") for ab in "ab"
  }


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(targets="ffn"), "matches none of a layer's modules"),
    (dict(targets="attn("), "not a regular expression"),
    (dict(rank=17), "attn.k projection (32 -> 16)"),
    (dict(rank=0), "rank must be a positive integer"),
    (dict(alpha=0.0), "alpha must be positive"),
    (dict(quantize="fp8"), "quantize='fp8'; expected one of"),
    (dict(tile_size=8), "tile_size is for quantize"),
    (
      dict(quantize="int8", tile_size=16),
      "tile_size=16 does not divide the attn.o projection's contracted "
      "axis (8)",
    ),
  ],
)
def test_bad_settings_are_named(change, message):
  settings = dict(rank=4, alpha=8.0, targets="attn|mlp") | change
  with pytest.raises(
    ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
  ):
    T.create(CFG.replace(lora=LoraConfig(**settings)))


def test_a_compute_dtype_other_than_the_weights_is_refused():
  # qwix finds a weight by identity; a cast would hide it and train nothing.
  cfg = CFG.replace(dtype="bfloat16", lora=LoraConfig(rank=4, alpha=8.0))
  with pytest.raises(
    ValueError, match="param_dtype='float32', dtype='bfloat16'"
  ):
    T.create(cfg)


def test_adapters_shard_like_their_weights():
  # Logical axes -> a (4-way fsdp, 2-way tensor) mesh's specs: A splits
  # its input axis as the weight does, B its output axis; rank unsharded.
  from types import SimpleNamespace

  from configs import common
  from starpo_jax import sharding

  cfg = CFG.replace(lora=LoraConfig(rank=4, alpha=8.0))
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: T.Transformer(cfg, nnx.Rngs(0)))
  abstract = nnx.state(model)
  names = nnx.get_partition_spec(abstract)
  mesh = SimpleNamespace(shape={"data": 1, "fsdp": 4, "tensor": 2})
  rules = common.base_config().logical_axis_rules

  def of(module, name):
    leaf = abstract["layers"][module][name]
    return sharding.spec(
      tuple(names["layers"][module][name]), leaf.shape, mesh, rules
    )

  assert of("mlp", "gate") == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert of("mlp", "gate_lora_a") == jax.sharding.PartitionSpec(
    None, "fsdp", None
  )
  assert of("mlp", "gate_lora_b") == jax.sharding.PartitionSpec(
    None, None, "tensor"
  )
  assert of("attn", "o_lora_a")[1:3] == of("attn", "o")[1:3]


def test_an_adapted_model_exports_its_merged_weights(qwen2_dir, tmp_path):
  # The Hugging Face export of an adapted model holds W + (alpha/r) A B:
  # transformers gives the adapted model's logits.
  from starpo_jax.models import hf
  from tests.models.conftest import VOCAB, torch_logits

  base = hf.load(qwen2_dir)
  cfg = base.cfg.replace(lora=LoraConfig(rank=2, alpha=4.0))
  model = T.create(cfg, seed=1)
  nnx.update(model, nnx.state(base, lora.WEIGHTS))
  perturb(model, seed=3, scale=0.2)
  hf.save(model, str(tmp_path))
  tokens = np.arange(24).reshape(2, 12) % VOCAB
  ours = np.asarray(model(jnp.asarray(tokens))[0])
  assert np.abs(ours - np.asarray(base(jnp.asarray(tokens))[0])).max() > 1e-2
  np.testing.assert_allclose(
    torch_logits(str(tmp_path), tokens), ours, atol=1e-4
  )


# The largest logit difference from the float model, as a fraction of the
# largest logit, by weight type (measured: 0.5%, 9.7%, 8.8%): int8 rounds
# each weight to 1/254 of its channel's range, int4 and nf4 to 1/15.
QLORA_TOLERANCE = {"int8": 0.02, "int4": 0.15, "nf4": 0.15}


@pytest.mark.parametrize("qtype", sorted(QLORA_TOLERANCE))
def test_a_quantized_base_stays_near_the_float_one(qtype):
  base = T.create(CFG, seed=1)
  plain = nnx.to_pure_dict(nnx.state(base, lora.WEIGHTS))
  cfg = CFG.replace(lora=LoraConfig(rank=4, alpha=8.0, quantize=qtype))
  model = T.create(cfg, seed=2)
  quantized = T.quantize_weights(cfg, plain)
  # The layers' projections are stored quantized, nothing else.
  q = quantized["layers"]["attn"]["q"]["array"]
  assert q["qvalue"].dtype == jnp.dtype(qtype if qtype != "nf4" else "uint4")
  assert quantized["embed"] is plain["embed"]
  weights = nnx.state(model, lora.WEIGHTS)
  nnx.replace_by_pure_dict(weights, quantized)
  nnx.update(model, weights)
  want = np.asarray(base(TOKENS)[0])
  got = np.asarray(model(TOKENS)[0])
  diff = np.abs(got - want).max() / np.abs(want).max()
  assert 0 < diff < QLORA_TOLERANCE[qtype], diff


def test_weights_quantized_after_loading_equal_qwixs_own():
  # A model created quantized (qwix quantizes as it adapts each layer)
  # and its float twin quantized afterwards hold the same values.
  cfg = CFG.replace(lora=LoraConfig(rank=4, alpha=8.0, quantize="nf4"))
  made = nnx.to_pure_dict(nnx.state(T.create(cfg, seed=3), lora.WEIGHTS))
  float_cfg = CFG.replace(lora=LoraConfig(rank=4, alpha=8.0))
  twin = T.create(float_cfg, seed=3)
  after = T.quantize_weights(
    cfg, nnx.to_pure_dict(nnx.state(twin, lora.WEIGHTS))
  )
  flat = lambda t: dict(jax.tree_util.tree_leaves_with_path(t))
  assert flat(made).keys() == flat(after).keys()
  for k, v in flat(made).items():
    np.testing.assert_array_equal(np.asarray(v), np.asarray(flat(after)[k]))


def test_a_qlora_model_exports_its_dequantized_merged_weights(
  qwen2_dir, tmp_path
):
  from starpo_jax.models import hf
  from tests.models.conftest import VOCAB, torch_logits

  base = hf.load(qwen2_dir)
  cfg = base.cfg.replace(
    lora=LoraConfig(rank=2, alpha=4.0, quantize="int4", tile_size=16)
  )
  model = T.create(cfg, seed=1)
  weights = nnx.state(model, lora.WEIGHTS)
  nnx.replace_by_pure_dict(
    weights,
    T.quantize_weights(cfg, nnx.to_pure_dict(nnx.state(base, lora.WEIGHTS))),
  )
  nnx.update(model, weights)
  perturb(model, seed=3, scale=0.2)
  hf.save(model, str(tmp_path))
  tokens = np.arange(24).reshape(2, 12) % VOCAB
  ours = np.asarray(model(jnp.asarray(tokens))[0])
  np.testing.assert_allclose(
    torch_logits(str(tmp_path), tokens), ours, atol=1e-4
  )
