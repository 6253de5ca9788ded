"""Tiny Hugging Face checkpoints made by ``transformers`` (nothing is
downloaded), shared by the model tests."""

from __future__ import annotations

import pytest
import torch
import transformers

VOCAB = 97


def _save(model, path) -> str:
  model.save_pretrained(path)
  return str(path)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> str:
  """Qwen2 with q/k/v biases and an untied head, random weights."""
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    initializer_range=0.3,
  )
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.normal_(0.0, 0.3)
  return _save(model, tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
  """Llama with tied embeddings, Llama 3 RoPE scaling and head_dim != D/H."""
  torch.manual_seed(1)
  cfg = transformers.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    rope_theta=500_000.0,
    rope_scaling={
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32,
    },
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
  )
  model = transformers.LlamaForCausalLM(cfg).eval()
  return _save(model, tmp_path_factory.mktemp("llama"))


@pytest.fixture(params=["qwen2", "llama"])
def hf_dir(request, qwen2_dir, llama_dir) -> str:
  return {"qwen2": qwen2_dir, "llama": llama_dir}[request.param]


def torch_logits(path: str, tokens) -> torch.Tensor:
  model = transformers.AutoModelForCausalLM.from_pretrained(
    path, dtype=torch.float32
  ).eval()
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


# A tiny Llama written as GGUF, the way llama.cpp's converter writes one:
# Hugging Face names -> GGUF names, the query and key rows of each head
# interleaved (row 2i <- row i, row 2i + 1 <- row head_dim / 2 + i), and
# each tensor in the quantization type given here.
GGUF_NAMES = {
  "model.embed_tokens.weight": "token_embd.weight",
  "model.norm.weight": "output_norm.weight",
  "lm_head.weight": "output.weight",
}
GGUF_LAYER_NAMES = {
  "input_layernorm.weight": "attn_norm.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.o_proj.weight": "attn_output.weight",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight",
}
# Quantization types by GGUF name suffix (norms stay F32, as llama.cpp's).
GGUF_TYPES = {
  "token_embd.weight": "Q8_0",
  "attn_q.weight": "Q4_1",
  "attn_k.weight": "Q4_1",
  "attn_v.weight": "Q8_0",
  "attn_output.weight": "Q4_1",
  "ffn_gate.weight": "Q4_1",
  "ffn_up.weight": "Q8_0",
  "ffn_down.weight": "Q4_1",
}


def interleave_heads(w, heads: int):
  """Hugging Face's query/key rows in llama.cpp's order."""
  rows, cols = w.shape
  half = rows // heads // 2
  out = w.reshape(heads, 2, half, cols).transpose(0, 2, 1, 3)
  return out.reshape(rows, cols)


def gguf_tokenizer():
  """A byte-level BPE trained here, with ChatML markers as specials."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False),
    ]
  )
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=384,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  from starpo_jax.cli import verify

  tok.train_from_iterator([verify.PASSAGE] * 4 + verify.corpus(200), trainer)
  return tok


def write_gguf(path, model, tok, pre: str = "smollm") -> str:
  """``model`` (a transformers Llama) and ``tok`` as a GGUF file."""
  import json

  import gguf

  cfg = model.config
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
  specials = {t.content for t in tok.get_added_tokens_decoder().values()}
  w.add_token_list([t for t, _ in vocab])
  w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
  merges = json.loads(tok.to_str())["model"]["merges"]
  w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
  w.add_bos_token_id(tok.token_to_id("<|im_start|>"))
  w.add_eos_token_id(tok.token_to_id("<|im_end|>"))
  w.add_chat_template(
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + "
    "m['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
  )
  heads = {
    "self_attn.q_proj.weight": cfg.num_attention_heads,
    "self_attn.k_proj.weight": cfg.num_key_value_heads,
  }
  for name, tensor in model.state_dict().items():
    if name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue  # tied: the embedding is the head, as llama.cpp writes it
    x = tensor.detach().numpy().astype("float32")
    if name in GGUF_NAMES:
      gname = GGUF_NAMES[name]
    else:
      _, _, i, rest = name.split(".", 3)
      gname = f"blk.{i}.{GGUF_LAYER_NAMES[rest]}"
      if rest in heads:
        x = interleave_heads(x, heads[rest])
    kind = GGUF_TYPES.get(gname.split(".", 2)[-1] if "blk" in gname else gname)
    if kind is None:
      w.add_tensor(gname, x)
    else:
      qtype = gguf.GGMLQuantizationType[kind]
      w.add_tensor(gname, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.fixture(scope="session")
def gguf_file(tmp_path_factory) -> str:
  """A tiny Llama (tied embeddings) and its tokenizer as one GGUF file,
  in a directory of its own."""
  tok = gguf_tokenizer()
  torch.manual_seed(2)
  cfg = transformers.LlamaConfig(
    vocab_size=tok.get_vocab_size(),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    rope_theta=10_000.0,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
  )
  model = transformers.LlamaForCausalLM(cfg).eval()
  return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model, tok)
