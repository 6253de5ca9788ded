"""The decoder against transformers, its KV cache, generation and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from starpo_jax.models import hf, presets, sampling, transformer
from tests.helpers import assert_compiles_once
from tests.models.conftest import VOCAB, torch_logits


def random_tokens(shape, seed=0):
  return np.random.default_rng(seed).integers(0, VOCAB, shape)


def test_logits_match_transformers(hf_dir):
  tokens = random_tokens((3, 40))
  ours = np.asarray(hf.load(hf_dir)(jnp.asarray(tokens))[0])
  theirs = torch_logits(hf_dir, tokens)
  assert np.abs(ours - theirs).max() <= 1e-4


def test_mlp_weight_gradients_match_transformers(qwen2_dir):
  # The MLP's projections have their own gradient rule (models/dense.py):
  # gate and up (64 -> 96) transpose their input, down (96 -> 64) its
  # output's cotangent. torch's autograd is the reference.
  tokens = random_tokens((2, 24), seed=7)
  targets = random_tokens((2, 24), seed=8)
  graphdef, params = nnx.split(hf.load(qwen2_dir), nnx.Param)

  def loss(params):
    logits, _ = nnx.merge(graphdef, params)(jnp.asarray(tokens))
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], -1).sum()

  ours = nnx.to_pure_dict(jax.jit(jax.grad(loss))(params))["layers"]["mlp"]
  ref = transformers.AutoModelForCausalLM.from_pretrained(
    qwen2_dir, dtype=torch.float32
  )
  logp = torch.log_softmax(ref(torch.tensor(tokens)).logits, -1)
  logp.gather(-1, torch.tensor(targets)[..., None]).sum().backward()
  for name in ("gate", "up", "down"):
    for i, layer in enumerate(ref.model.layers):
      want = getattr(layer.mlp, f"{name}_proj").weight.grad.numpy().T
      got = np.asarray(ours[name][i])
      assert np.abs(want).max() > 1e-3, name
      np.testing.assert_allclose(
        got, want, rtol=0, atol=1e-4 * np.abs(want).max(), err_msg=name
      )


def test_exported_model_reloads_in_transformers_with_the_same_logits(
  hf_dir, tmp_path
):
  model = hf.load(hf_dir)
  hf.save(model, str(tmp_path))
  tokens = random_tokens((2, 33), seed=1)
  ours = np.asarray(model(jnp.asarray(tokens))[0])
  theirs = torch_logits(str(tmp_path), tokens)
  assert np.abs(ours - theirs).max() <= 1e-4


def test_greedy_generation_matches_transformers_for_32_tokens(qwen2_dir):
  model = hf.load(qwen2_dir)
  graphdef, state = nnx.split(model)
  prompts = random_tokens((2, 7), seed=2)

  @jax.jit
  def greedy(state, prompt):
    return sampling.generate(
      nnx.merge(graphdef, state),
      prompt,
      jnp.full((prompt.shape[0],), prompt.shape[1]),
      max_new_tokens=32,
      key=jax.random.key(0),
      sampling=sampling.Sampling(temperature=0.0),
    )

  tokens, _, lengths = greedy(state, jnp.asarray(prompts))
  ref = transformers.AutoModelForCausalLM.from_pretrained(
    qwen2_dir, dtype=torch.float32
  ).eval()
  with torch.no_grad():
    out = ref.generate(
      torch.as_tensor(prompts),
      max_new_tokens=32,
      min_new_tokens=32,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=0,
    )
  np.testing.assert_array_equal(np.asarray(tokens), out[:, 7:].numpy())
  assert np.all(np.asarray(lengths) == 32)


def test_cached_prefill_and_decode_equal_the_full_forward():
  cfg = presets.preset("tiny", vocab_size=61, num_layers=3)
  model = transformer.create(cfg, seed=3)
  seqs = random_tokens((3, 30), seed=3) % 61
  step = jax.jit(lambda m, t, c, n: m(t, c, n))
  full = np.asarray(jax.jit(lambda m, t: m(t)[0])(model, jnp.asarray(seqs)))
  # Sequences sit at different positions: prompts of 5, 11 and 2 tokens in
  # one padded chunk, then token-by-token decoding.
  lengths = np.array([5, 11, 2])
  chunk = np.zeros((3, 12), np.int64)
  for b, n in enumerate(lengths):
    chunk[b, :n] = seqs[b, :n]
  cache = transformer.KVCache.init(cfg, 3, 32)
  logits, cache = step(model, jnp.asarray(chunk), cache, jnp.asarray(lengths))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(
      np.asarray(logits)[b, :n], full[b, :n], atol=1e-5
    )
  np.testing.assert_array_equal(np.asarray(cache.length), lengths)
  pos = lengths.copy()
  rows = np.arange(3)
  for _ in range(12):
    token = jnp.asarray(seqs[rows, pos][:, None])
    logits, cache = step(model, token, cache, jnp.ones(3, jnp.int32))
    np.testing.assert_allclose(
      np.asarray(logits)[:, 0], full[rows, pos], atol=1e-5
    )
    pos += 1
  np.testing.assert_array_equal(np.asarray(cache.length), pos)


@pytest.mark.parametrize(
  "layers, remat", [(3, "none"), (1, "none"), (2, "full")]
)
def test_hidden_states_at_some_tokens_equal_the_full_forward_there(
  layers, remat
):
  # The last layer runs its queries and MLP at ``at`` only: values and
  # every parameter's gradient as the whole forward's, taken there.
  cfg = presets.preset("tiny", vocab_size=61, num_layers=layers, remat=remat)
  graphdef, params = nnx.split(transformer.create(cfg, seed=6))
  tokens = jnp.asarray(random_tokens((3, 30), seed=6) % 61)
  at = jnp.asarray([[0, 7, 7, 29], [3, 4, 5, 6], [29, 1, 0, 12]], jnp.int32)
  take = jax.vmap(lambda x, i: x[i])

  def loss(params, select):
    h = select(nnx.merge(graphdef, params))
    return jnp.sum(jnp.sin(h)), h

  grad = lambda f: jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)(
    params, f
  )
  want, h_full = grad(lambda m: take(m.hidden(tokens)[0], at))
  got, h_at = grad(lambda m: m.hidden(tokens, at=at)[0])
  np.testing.assert_allclose(h_at, h_full, atol=1e-5)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    scale = float(np.abs(b).max())
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5 * scale)


def test_a_prefill_at_its_last_tokens_equals_the_full_forward_there():
  cfg = presets.preset("tiny", vocab_size=61, num_layers=2)
  model = transformer.create(cfg, seed=7)
  seqs = jnp.asarray(random_tokens((3, 12), seed=7) % 61)
  full = jax.jit(lambda m, t: m.hidden(t)[0])(model, seqs)
  lengths = jnp.asarray([5, 12, 1], jnp.int32)
  last = (lengths - 1)[:, None]
  prefill = jax.jit(
    lambda m, t, n, at: m.for_decoding().hidden(t, m.init_cache(3, 16), n, at)
  )
  h, cache = prefill(model, seqs, lengths, last)
  _, whole = prefill(model, seqs, lengths, None)
  np.testing.assert_allclose(
    h[:, 0], jnp.take_along_axis(full, last[..., None], 1)[:, 0], atol=1e-5
  )
  for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(whole), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bfloat16_policy_tracks_float32():
  cfg = presets.preset("tiny", vocab_size=61)
  f32 = transformer.create(cfg, seed=4)
  bf16 = transformer.create(
    cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  )
  nnx.update(
    bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(f32))
  )
  tokens = jnp.asarray(random_tokens((2, 20), seed=4) % 61)
  forward = jax.jit(lambda m, t: m(t)[0])
  a = np.asarray(forward(f32, tokens))
  b = np.asarray(forward(bf16, tokens))
  assert b.dtype == np.float32  # logits always come out in float32
  assert jax.tree.leaves(nnx.state(bf16))[0].dtype == jnp.bfloat16
  assert np.abs(a - b).max() < 0.05 * np.abs(a).max() + 0.05
  assert np.mean(a.argmax(-1) == b.argmax(-1)) > 0.9


def test_value_head_gives_one_value_per_token():
  cfg = presets.preset("tiny", vocab_size=61, value_head=True)
  model = transformer.create(cfg, seed=5)
  h, _ = model.hidden(jnp.zeros((2, 9), jnp.int32))
  assert model.values(h).shape == (2, 9)


def test_parameters_carry_logical_axis_names():
  model = transformer.create(presets.preset("tiny", vocab_size=61))
  specs = nnx.get_partition_spec(nnx.state(model))
  assert tuple(specs["embed"].get_value()) == ("vocab", "embed")
  assert tuple(specs["layers"]["attn"]["q"].get_value()) == (
    "layers",
    "embed",
    "heads",
    "head_dim",
  )
  assert tuple(specs["layers"]["mlp"]["down"].get_value()) == (
    "layers",
    "mlp",
    "embed",
  )


@pytest.mark.parametrize(
  "overrides, name",
  [
    (dict(num_heads=6, num_kv_heads=4), "num_kv_heads"),
    (dict(head_dim=31), "head_dim"),
    (dict(dtype="float16"), "dtype"),
    (dict(family="gpt2"), "family"),
    (dict(num_layers=0), "num_layers"),
  ],
)
def test_bad_model_settings_are_rejected_naming_the_field(overrides, name):
  with pytest.raises(ValueError, match=name):
    presets.preset("tiny", vocab_size=61, **overrides)


def test_presets_have_the_published_parameter_counts():
  # Hugging Face model cards: Qwen2.5-0.5B 0.49B, 1.5B 1.54B, 3B 3.09B,
  # 7B 7.62B; Llama-3.2-1B 1.24B, 3B 3.21B.
  published = {
    "qwen2.5-0.5b": 0.49e9,
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-3b": 3.09e9,
    "qwen2.5-7b": 7.62e9,
    "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9,
  }
  for name, count in published.items():
    assert presets.preset(name).num_params() == pytest.approx(count, rel=0.01)


def test_jitted_forward_and_decode_step_compile_once():
  cfg = presets.preset("tiny", vocab_size=61)
  graphdef, state = nnx.split(transformer.create(cfg))

  def forward(state, tokens):
    return nnx.merge(graphdef, state)(tokens)[0]

  tokens = [jnp.asarray(random_tokens((2, 16), seed=s) % 61) for s in (6, 7)]
  assert_compiles_once(forward, (state, tokens[0]), (state, tokens[1]))

  def decode(state, token, cache):
    return nnx.merge(graphdef, state)(token, cache)

  cache = transformer.KVCache.init(cfg, 2, 32)
  _, cache = nnx.merge(graphdef, state)(tokens[0][:, :4], cache)
  (_, cache1), _ = assert_compiles_once(
    decode,
    (state, tokens[0][:, 4:5], cache),
    (state, tokens[1][:, 5:6], cache),
  )
  np.testing.assert_array_equal(np.asarray(cache1.length), [5, 5])


def test_remat_policies_give_the_same_gradients_with_less_memory():
  tokens = jnp.asarray(random_tokens((2, 64), seed=4) % 61)

  def grads(remat):
    cfg = presets.preset("tiny", vocab_size=61, num_layers=3, remat=remat)
    graphdef, params = nnx.split(transformer.create(cfg, seed=5))

    def loss(params):
      logits, _ = nnx.merge(graphdef, params)(tokens)
      return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    fn = jax.jit(jax.grad(loss))
    temp = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
    return jax.tree.leaves(fn(params)), temp

  plain, plain_temp = grads("none")
  for policy in ("dots", "full"):
    remat, remat_temp = grads(policy)
    for a, b in zip(plain, remat, strict=True):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
    assert remat_temp < plain_temp, policy


def test_unknown_remat_policy_and_attention_are_named():
  with pytest.raises(ValueError, match="remat=True"):
    presets.preset("tiny", vocab_size=61, remat=True)
  with pytest.raises(ValueError, match="attention='flash'"):
    presets.preset("tiny", vocab_size=61, attention="flash")
