"""Tokenizers through the ``tokenizers`` library (no ``transformers``).

``Tokenizer.load(dir_or_file)`` reads a Hugging Face ``tokenizer.json``;
``build_compact(pieces)`` makes the built-in vocabulary for models trained
from scratch: the 256 byte-level tokens (so any text encodes), the chat
markers and answer tags, and one token per environment piece. Both go
through the same ``tokenizer.json`` path.

The chat format is a set of pieces (``ChatFormat``), so rollouts build
prompts from text pieces with either vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """A chat template as text pieces.

  A conversation renders as ``begin`` then, per message,
  ``role_start.format(role=...)`` + content + ``message_end``; a generation
  prompt ends with ``role_start`` of the assistant, and generation stops at
  ``stop`` (which is the first token of ``message_end``).
  """

  name: str
  begin: str
  role_start: str
  message_end: str
  stop: str

  def start(self, role: str) -> str:
    return self.role_start.format(role=role)

  def render(self, messages: Sequence[tuple[str, str]], generate: bool) -> str:
    """Messages ``(role, content)`` as text, optionally opening a reply."""
    text = self.begin + "".join(
      self.start(role) + content + self.message_end
      for role, content in messages
    )
    return text + (self.start("assistant") if generate else "")


# Qwen2 / Qwen2.5 (and the built-in vocabulary).
CHATML = ChatFormat(
  name="chatml",
  begin="",
  role_start="<|im_start|>{role}\n",
  message_end="<|im_end|>\n",
  stop="<|im_end|>",
)
# Llama 3.x.
LLAMA3 = ChatFormat(
  name="llama3",
  begin="<|begin_of_text|>",
  role_start="<|start_header_id|>{role}<|end_header_id|>\n\n",
  message_end="<|eot_id|>",
  stop="<|eot_id|>",
)
FORMATS = (CHATML, LLAMA3)


@functools.cache
def byte_to_char() -> dict[int, str]:
  """GPT-2's reversible map from bytes to printable characters."""
  printable = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
  )
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


@functools.cache
def char_to_byte() -> dict[str, int]:
  return {c: b for b, c in byte_to_char().items()}


class TokenizerError(ValueError):
  """A tokenizer file that cannot be used, naming the file."""


class Tokenizer:
  """A byte-level BPE tokenizer with a chat format.

  Attributes:
    chat: the ``ChatFormat`` found from the vocabulary's markers.
    chat_template: the checkpoint's own Jinja template, if it has one
      (kept for export; prompts are built from ``chat``).
    eos_id: the end-of-text token.
    stop_ids: tokens that end a generated turn (end of message, eos).
    merges: whether its BPE merges bytes (a pretrained tokenizer); the
      compact one has none, so a text's tokens are its words' tokens.
  """

  def __init__(
    self,
    tok: tokenizers.Tokenizer,
    eos: str,
    where: str,
    chat_template: str = "",
  ) -> None:
    self._tok = tok
    self.where = where
    self.chat_template = chat_template
    vocab = tok.get_vocab(with_added_tokens=True)
    chats = [f for f in FORMATS if f.stop in vocab]
    if not chats:
      raise TokenizerError(
        f"{where}: no known chat markers ({', '.join(f.stop for f in FORMATS)})"
      )
    self.chat = chats[0]
    if eos not in vocab:
      raise TokenizerError(f"{where}: end-of-text token {eos!r} is not in it")
    self.eos_id = vocab[eos]
    self.stop_ids = tuple(sorted({vocab[self.chat.stop], self.eos_id}))
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {
      d.get("type") for d in decoder.get("decoders", [])
    }
    if "ByteLevel" not in kinds:
      raise TokenizerError(
        f"{where}: only byte-level BPE tokenizers are supported (Qwen2, "
        f"Llama 3, the built-in one); its decoder is {decoder.get('type')!r}"
      )
    self._added = {
      i: t.content for i, t in tok.get_added_tokens_decoder().items()
    }
    model = json.loads(tok.to_str()).get("model") or {}
    self.merges = bool(model.get("merges"))

  @classmethod
  def load(cls, path: str) -> Tokenizer:
    """Reads ``tokenizer.json`` (a file, or a model directory holding one).

    The end-of-text token comes from ``tokenizer_config.json`` beside it when
    present, else the format's usual one.
    """
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise TokenizerError(f"{file}: no such file")
    try:
      tok = tokenizers.Tokenizer.from_file(file)
    except Exception as e:
      raise TokenizerError(f"{file}: cannot be read: {e}") from None
    config = _tokenizer_config(os.path.dirname(file))
    eos = config.get("eos_token")
    if isinstance(eos, dict):
      eos = eos.get("content")
    return cls(
      tok, eos or _default_eos(tok), file, config.get("chat_template", "")
    )

  def save(self, path: str) -> str:
    """Writes ``tokenizer.json`` into directory ``path``; returns the file."""
    os.makedirs(path, exist_ok=True)
    file = os.path.join(path, "tokenizer.json")
    self._tok.save(file)
    config = {
      "eos_token": self.id_to_token(self.eos_id),
      "chat_format": self.chat.name,
    }
    if self.chat_template:
      config["chat_template"] = self.chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump(config, f, indent=2)
    return file

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [
      e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)
    ]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=False)

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def id_to_token(self, i: int) -> str:
    return self._tok.id_to_token(i)

  def token_bytes(self, i: int) -> bytes:
    """The raw bytes token ``i`` stands for (possibly part of a character)."""
    if i in self._added:
      return self._added[i].encode("utf-8")
    table = char_to_byte()
    return bytes(table[c] for c in self._tok.id_to_token(i))


def _tokenizer_config(directory: str) -> dict:
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _default_eos(tok: tokenizers.Tokenizer) -> str:
  vocab = tok.get_vocab(with_added_tokens=True)
  for candidate in ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>"):
    if candidate in vocab:
      return candidate
  return "<|im_end|>"


# Pieces longer than this are split into words, so no token spans a whole
# sentence: that keeps the bytes per token (and answer parsing) small.
MAX_WORD_BYTES = 24
_WORDS = re.compile(r"\s*\S+|\s+")


def words(piece: str) -> list[str]:
  """``piece`` as one word, or split before runs of whitespace if long."""
  if len(piece.encode("utf-8")) <= MAX_WORD_BYTES:
    return [piece]
  return _WORDS.findall(piece)


def build_compact(
  pieces: Iterable[str], chat: ChatFormat = CHATML
) -> Tokenizer:
  """The built-in vocabulary: bytes, chat markers, tags and ``pieces``.

  Short pieces become one token each, long ones one token per word
  (whitespace attached to the word after it); tokens are matched verbatim,
  longest first, before the byte-level fallback, so environment text costs
  few tokens while any other text still encodes.
  """
  b2c = byte_to_char()
  tok = tokenizers.Tokenizer(
    models.BPE(vocab={b2c[b]: b for b in range(256)}, merges=[])
  )
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(
    add_prefix_space=False, use_regex=False
  )
  tok.decoder = decoders.ByteLevel()
  markers = ["<|endoftext|>", chat.stop, *_markers(chat)]
  tok.add_special_tokens(list(dict.fromkeys(markers)))
  vocab = [*TAGS, *(w for p in pieces for w in words(p))]
  vocab = [w for w in dict.fromkeys(vocab) if len(w.encode("utf-8")) > 1]
  tok.add_tokens([AddedToken(w, normalized=False) for w in vocab])
  return Tokenizer(tok, "<|endoftext|>", "built-in compact tokenizer")


def _markers(chat: ChatFormat) -> list[str]:
  """The special tokens of a chat format (e.g. ``<|im_start|>``)."""
  text = chat.begin + chat.role_start + chat.message_end
  out, i = [], 0
  while (start := text.find("<|", i)) >= 0:
    end = text.find("|>", start)
    out.append(text[start : end + 2])
    i = end + 2
  return out
