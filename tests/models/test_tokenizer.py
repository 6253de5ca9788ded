"""Tokenizers: the built-in compact one and a byte-level BPE trained here."""

from __future__ import annotations

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers, trainers

import envs
from starpo_jax.models import tokenizer as tokenizer_lib

ENV_VARIANTS = [
  ("sokoban", dict(render_mode="grid_coord")),
  ("sokoban", dict(render_mode="grid", symbols="alternate")),
  ("sokoban_larger", dict(render_mode="grid_coord")),
  ("frozen_lake", dict(render_mode="grid_coord")),
  ("bandit", {}),
]


def all_pieces() -> list[str]:
  pieces = []
  for name, kwargs in ENV_VARIANTS:
    pieces += envs.make(name, **kwargs).spec.pieces
  return pieces


@pytest.fixture(scope="module")
def compact():
  return tokenizer_lib.build_compact(all_pieces())


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  """A byte-level BPE with ChatML markers, trained on environment text."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  corpus = all_pieces() + [envs.make("sokoban").spec.instructions] * 5
  tok.train_from_iterator(corpus, trainer)
  path = tmp_path_factory.mktemp("bpe")
  tok.save(str(path / "tokenizer.json"))
  return tokenizer_lib.Tokenizer.load(str(path))


def test_pieces_tags_and_markers_are_single_tokens_or_words(compact):
  texts = [*all_pieces(), *tokenizer_lib.TAGS, "<|im_start|>", "<|im_end|>"]
  for text in texts:
    ids = compact.encode(text)
    assert compact.decode(ids) == text
    if len(tokenizer_lib.words(text)) == 1:
      assert len(ids) == 1, (text, ids)
    else:
      # Long pieces go word by word, far below one token per byte.
      assert len(ids) <= len(text.encode()) // 3, (text, ids)


def test_compact_tokenizer_is_small(compact):
  assert compact.vocab_size < 700


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_round_trips(compact, bpe, text):
  for tok in (compact, bpe):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_token_bytes_concatenate_to_the_utf8_text(compact, bpe, text):
  for tok in (compact, bpe):
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()


def test_save_and_load_through_tokenizer_json(compact, tmp_path):
  compact.save(str(tmp_path))
  loaded = tokenizer_lib.Tokenizer.load(str(tmp_path))
  assert loaded.vocab_size == compact.vocab_size
  assert loaded.eos_id == compact.eos_id
  assert loaded.chat == tokenizer_lib.CHATML
  text = "<|im_start|>user\nTurn 1:\nState:\n#P_X#<|im_end|>"
  assert loaded.encode(text) == compact.encode(text)


def test_chat_format_renders_qwen_style_messages(bpe):
  text = bpe.chat.render([("system", "Be brief."), ("user", "Hi")], True)
  assert text == (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
  )
  assert bpe.token_to_id("<|im_end|>") in bpe.stop_ids


def test_unusable_tokenizer_files_are_named(tmp_path):
  with pytest.raises(tokenizer_lib.TokenizerError, match="no such file"):
    tokenizer_lib.Tokenizer.load(str(tmp_path / "missing.json"))
  tok = tokenizers.Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, "[UNK]"))
  tok.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(tokenizer_lib.TokenizerError, match=r"tokenizer\.json"):
    tokenizer_lib.Tokenizer.load(str(tmp_path))
