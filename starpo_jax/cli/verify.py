"""A checkpoint read here against ``transformers`` reading the same files:
logits, token ids and greedy generations (``python -m starpo_jax.hf
verify``). ``transformers`` (with ``gguf`` for GGUF files) is a test
dependency; without it nothing is compared and the report says so.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import envs
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.models import checkpoints, gguf
from starpo_jax.models import tokenizer as tokenizer_lib

# The most a logit may differ from transformers' (float32, real text,
# both reading the same weights dequantized the same way). Two float32
# forward passes differ by their sums' rounding: on SmolLM2-135M's 30
# layers (logits up to 35) ours and transformers' differ by 1.7e-4 to
# 6e-4 as XLA fuses and tiles differently, and transformers' own float32
# logits are 2.9e-4 from its float64 ones. A misread tensor or head order
# moves them by more than 0.1. The report gives both float32 readings
# distance from transformers' float64 logits.
LOGIT_TOLERANCE = 1e-3

# llama.cpp's pre-tokenizer rules (``tokenizer.ggml.pre``) as regular
# expressions applied one after another, each to the pieces the one
# before left (text no expression matches stays a piece of its own):
# what the files say to do, written apart from gguf.PRE_TOKENIZERS.
_GPT2_SPLIT = (
  r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
LLAMA_CPP_SPLITS = {
  "smollm": (r"\p{N}", _GPT2_SPLIT),
  "gpt2": (_GPT2_SPLIT,),
  "default": (_GPT2_SPLIT,),
}

PASSAGE = (
  "The Sokoban puzzle was created in 1981 by Hiroyuki Imabayashi. A "
  "warehouse keeper pushes boxes onto storage locations; a box can be "
  "pushed but never pulled, so one careless move can leave a level "
  "unsolvable. Reinforcement learning agents that play it must plan "
  "several steps ahead. FrozenLake asks for a path across ice to a goal "
  "without falling through a hole, and in its slippery version the agent "
  "moves where it meant to only one time in three. Countdown gives a few "
  "numbers (say 25, 50, 75, 100 and 3) and a target such as 952, to be "
  "reached with +, -, * and / using each number at most once. "
  "Multi-turn training lets the model read the environment's reply after "
  "every answer: 'You pushed the box to the left; reward -0.1.' It "
  "reasons inside <think>...</think> and answers inside "
  "<answer>...</answer>, e.g. <answer>Left || Up</answer>. Les élèves "
  "ont résolu 3 énigmes à 14h05 — naïve café, Zürich, 東京, 😀."
)

_PROMPT_ENVS = ("sokoban", "frozen_lake", "bandit", "countdown", "sudoku_4x4")
_GREEDY_PROMPT = "What is the capital of France? Answer in one sentence."


@functools.cache
def environment_prompts(per_env: int, seed: int = 0) -> tuple[str, ...]:
  """RAGEN's first-turn prompts (system message, the state, think
  format), chat-templated, on ``per_env`` levels of each environment."""
  settings = prompt_lib.PromptSettings(enable_think=True)
  out = []
  for name in _PROMPT_ENVS:
    env = envs.make(name)
    state, _ = jax.vmap(env.reset)(
      jax.random.split(jax.random.key(seed), per_env)
    )
    pieces, n = jax.device_get(jax.vmap(env.render)(state))
    for b in range(per_env):
      state = envs.to_text(env.spec, pieces[b], n[b])
      messages = [
        ("system", prompt_lib.system_text(env.spec, settings)),
        ("user", f"Turn 1:\nState:\n{state}"),
      ]
      out.append(tokenizer_lib.CHATML.render(messages, True) + "<think>")
  return tuple(out)


def corpus(n: int = 1000, seed: int = 0) -> list[str]:
  """``n`` strings to tokenize: environment prompts, the passage's
  sentences, and random mixes of words, digits, symbols, tags, chat
  markers, whitespace runs and multi-byte characters."""
  rng = np.random.default_rng(seed)
  texts = list(environment_prompts(8, seed))
  texts += [s.strip() for s in PASSAGE.split(". ")]
  words = PASSAGE.split()
  extras = [
    "</think>",
    "<answer>",
    "||",
    "<|im_end|>",
    "<|im_start|>",
    "  ",
    "\n\n",
    "\t",
    "12345",
    "3.14159",
    "-0.1",
    "x**2",
    "(a+b)*c",
    "naïve",
    "東京",
    "😀",
    "don't",
    "I'LL",
    "__init__",
    "#_O_X#",
  ]
  pool = words + extras
  while len(texts) < n:
    k = int(rng.integers(1, 12))
    parts = [pool[int(i)] for i in rng.integers(0, len(pool), k)]
    seps = [" ", "", "\n", "  "]
    texts.append(
      "".join(p + seps[int(rng.integers(0, len(seps)))] for p in parts)
    )
  return texts[:n]


def _reference(path: str) -> tuple[Any, Any]:
  """transformers' model and tokenizer of ``path`` (a directory, or a GGUF
  file), or ``(None, None)`` when the tokenizer is missing."""
  import torch
  import transformers

  if gguf.is_gguf(path):
    where, kwargs = (
      os.path.split(path)[0],
      {"gguf_file": os.path.basename(path)},
    )
  else:
    where, kwargs = path, {}
  model = transformers.AutoModelForCausalLM.from_pretrained(
    where, dtype=torch.float32, **kwargs
  )
  tok = None
  if gguf.is_gguf(path) or os.path.isfile(os.path.join(path, "tokenizer.json")):
    tok = transformers.AutoTokenizer.from_pretrained(where, **kwargs)
  return model, tok


def split_like_llama_cpp(
  text: str, pre: str, specials: tuple[str, ...]
) -> list[str]:
  """``text`` cut into what llama.cpp's pre-tokenizer ``pre`` hands to
  BPE: special tokens whole, then the rule's expressions in turn."""
  import regex

  pieces = [text]
  if specials:
    alternatives = "|".join(regex.escape(s) for s in specials)
    pieces = [p for p in regex.split(f"({alternatives})", text) if p]
  out = []
  for piece in pieces:
    chunks = [piece]
    if piece not in specials:
      for pattern in LLAMA_CPP_SPLITS[pre]:
        cut = []
        for chunk in chunks:
          pos = 0
          for m in regex.finditer(pattern, chunk):
            cut += [chunk[pos : m.start()]] if m.start() > pos else []
            cut += [m.group()] if m.end() > m.start() else []
            pos = m.end()
          cut += [chunk[pos:]] if pos < len(chunk) else []
        chunks = cut
    out += chunks
  return out


def _forward(model):
  """``tokens -> logits``, jitted with the weights as an argument (closed
  over, XLA would fold them in as constants)."""
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens)[0])
  return lambda tokens: fn(state, jnp.asarray(tokens, jnp.int32))


def _reference_ids(path: str, ref_tok) -> Any:
  """``text -> token ids`` by transformers' tokenizer; for a GGUF file,
  on the pieces llama.cpp's pre-tokenizer rule for it makes
  (transformers' GGUF converter splits only by GPT-2's expression, so
  for "smollm" it leaves digits together where llama.cpp isolates each)."""
  encode = lambda t: ref_tok(t, add_special_tokens=False)["input_ids"]
  if not gguf.is_gguf(path):
    return encode
  f = gguf.open_file(path)
  pre = f.value("tokenizer.ggml.pre", "default")
  kinds = zip(
    f.value("tokenizer.ggml.tokens"),
    f.value("tokenizer.ggml.token_type"),
    strict=True,
  )
  specials = tuple(t for t, k in kinds if k == gguf.CONTROL)
  return lambda text: [
    i for p in split_like_llama_cpp(text, pre, specials) for i in encode(p)
  ]


def _compare_tokens(ours_tok, ref_tok, path: str) -> dict[str, Any]:
  """Token ids of ``corpus()``, ours against the reference's."""
  texts = corpus()
  reference = _reference_ids(path, ref_tok)
  differ = [t for t in texts if ours_tok.encode(t) != reference(t)]
  report = {"strings_tokenized": len(texts), "token_id_mismatches": len(differ)}
  if differ:
    report["first_mismatch"] = repr(differ[0][:200])
  as_is = lambda t: ref_tok(t, add_special_tokens=False)["input_ids"]
  report["token_id_mismatches_with_transformers_splitting"] = sum(
    ours_tok.encode(t) != as_is(t) for t in texts
  )
  return report


def _compare_greedy(forward, ref_model, ours_tok, steps: int) -> dict[str, Any]:
  """``steps`` greedy tokens after a chat prompt by transformers'
  ``generate``, against ours, the stop tokens suppressed in both.

  Ours are read from one forward pass over the prompt and transformers'
  tokens (teacher forcing): our greedy choice after each of their
  prefixes. Equal at every position is the same as our own greedy
  generation being identical to theirs (each prefix then is ours too),
  and the first position that differs is where ours would part.
  """
  import torch

  prompt = ours_tok.encode(
    tokenizer_lib.CHATML.render([("user", _GREEDY_PROMPT)], True)
  )
  banned = list(ours_tok.stop_ids)
  with torch.no_grad():
    out = ref_model.generate(
      torch.tensor([prompt]),
      attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
      max_new_tokens=steps,
      do_sample=False,
      suppress_tokens=banned,
    )
  theirs = [int(t) for t in out[0, len(prompt) :]]
  tokens = np.asarray([prompt + theirs], np.int32)
  logits = np.array(forward(tokens)[0, len(prompt) - 1 : -1])
  logits[:, banned] = -np.inf
  mine = [int(t) for t in logits.argmax(-1)]
  pairs = enumerate(zip(mine, theirs, strict=True))
  differ = [i for i, (a, b) in pairs if a != b]
  report = {
    "greedy_tokens": steps,
    "greedy_identical": not differ,
    "greedy_text": repr(ours_tok.decode(theirs)),
  }
  if differ:
    report["greedy_first_difference"] = differ[0]
  return report


def verify(
  path: str, sequences: int = 4, length: int = 128, greedy: int = 64
) -> dict[str, Any]:
  """Compares this project's reading of the checkpoint at ``path`` (a
  directory, a GGUF file, or a packaged preset's name) with transformers'.

  Returns:
    A report: the largest logit difference over ``sequences`` x ``length``
    tokens of real text, the strings whose token ids differ (of
    ``corpus()``), whether ``greedy`` greedy tokens agree, and ``ok``:
    all within tolerance.
  """
  path = checkpoints.resolve(path)
  forward = _forward(checkpoints.load(path))
  report: dict[str, Any] = {"path": path}
  ours_tok = None
  if gguf.is_gguf(path) or os.path.isfile(os.path.join(path, "tokenizer.json")):
    ours_tok = checkpoints.tokenizer(path)
    # The passage and the first two levels of each environment's prompt
    # (the corpus's own: called as ``corpus`` calls it, computed once).
    prompts = environment_prompts(8, 0)
    firsts = [p for i, p in enumerate(prompts) if i % 8 < 2]
    ids = ours_tok.encode(" ".join([PASSAGE, *firsts]))
    ids = (ids * (1 + sequences * length // len(ids)))[: sequences * length]
  else:
    vocab = checkpoints.read_config(path).vocab_size
    ids = np.random.default_rng(0).integers(0, vocab, sequences * length)
  tokens = np.asarray(ids, np.int32).reshape(sequences, length)
  ours = np.asarray(forward(tokens))
  report["tokens"] = int(tokens.size)
  try:
    import torch
  except ImportError:
    return {**report, "transformers": "not installed", "ok": False}
  ref_model, ref_tok = _reference(path)
  with torch.no_grad():
    theirs = ref_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  report["max_abs_logit_diff"] = float(np.max(np.abs(ours - theirs)))
  report["top1_agreement"] = float(
    np.mean(ours.argmax(-1) == theirs.argmax(-1))
  )
  ok = report["max_abs_logit_diff"] <= LOGIT_TOLERANCE
  if ours_tok is not None:
    report.update(_compare_tokens(ours_tok, ref_tok, path))
    report.update(_compare_greedy(forward, ref_model, ours_tok, greedy))
    ok = ok and not report["token_id_mismatches"] and report["greedy_identical"]
  report.update(_against_float64(ref_model, tokens, ours, theirs))
  return {**report, "ok": ok}


def _against_float64(ref_model, tokens, ours, theirs) -> dict[str, float]:
  """How far ours and transformers' float32 logits each are from
  transformers' float64 ones: float32's own rounding, the floor under
  any float32 comparison (the reference model is converted in place)."""
  import torch

  with torch.no_grad():
    exact = ref_model.double()(torch.tensor(tokens, dtype=torch.long))
  exact = exact.logits.numpy()
  return {
    "max_abs_logit_diff_to_float64": float(np.max(np.abs(ours - exact))),
    "reference_float32_to_float64": float(np.max(np.abs(theirs - exact))),
  }
