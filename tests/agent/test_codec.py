"""The Codec: rendering, prompts and answer parsing inside jit, against
plain-Python references."""

from __future__ import annotations

import dataclasses
import functools
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from reference import text as ref
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import prompt as prompt_lib
from tests.envs.conftest import level_pool, to_numpy
from tests.helpers import FUZZ_EXAMPLES
from tests.text_fixtures import SETTINGS, TOKENIZERS, byte_token, env_variants

MAX_TOKENS = 64

FRAGMENTS = [
  "<think>",
  "</think>",
  "<answer>",
  "</answer>",
  "<Answer>",
  "</ANSWER>",
  "<answer >",
  "</ answer>",
  "<think",
  "answer>",
  "</",
  "<|im_end|>",
  "<|im_start|>",
  "||",
  "|",
  "|||",
  " || ",
  " ",
  "  ",
  "\n",
  "\t",
  "\r\n",
  "up",
  "UP",
  "Up",
  "Right",
  "rIgHt",
  "down",
  "LEFT",
  "Left ",
  " left",
  "Upp",
  "U p",
  "Teacher",
  "Trader",
  "nothing",
  "I think",
  "Right||Up",
  "√",
  "日本",
  "\u00a0",
  "é",
  "\u212a",
  "😀",
]


def random_answer(rng: random.Random) -> list:
  """A fragment list biased towards well-formed (and nearly) answers."""
  pick = lambda good, bad, p=0.85: good if rng.random() < p else rng.choice(bad)
  actions = ["Up", "down", "LEFT", "right", "Jump", "", " ", "Up Down", "uP"]
  actions += ["Teacher", "trader", "venturecapitalist", "Explorer", "Teach"]
  parts = [rng.choice(actions) for _ in range(rng.randint(0, 4))]
  sep = pick(rng.choice(["||", " || "]), ["|", "|||", ",", "||||"], 0.8)
  body = [
    # The prompt already opened <think>; replies sometimes repeat it.
    rng.choice(["", "", "", "<think>", "<Think>"]),
    rng.choice(["ok", "", "a</think>b", "<answer>x</answer>", "think"]),
    pick("</think>", ["</think >", "", "</Think>"]),
    rng.choice(["", "", " ", "\n\n", "\t", "x"]),
    pick("<answer>", ["<answer> ", "<answers>", "", "<ANSWER>"]),
    sep.join(parts),
    rng.choice(["", "", "<|im_end|>", "<think>", " "]),
    pick("</answer>", ["</answe", "", "</ANSWER>"]),
    rng.choice(["", "", "<|im_end|>", "</answer>", " more"]),
  ]
  return [f for f in body if f]


def random_fragments(rng: random.Random) -> list:
  if rng.random() < 0.6:
    out = random_answer(rng)
  else:
    out = [rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12))]
  if rng.random() < 0.3:
    # Raw bytes, often not valid UTF-8.
    out.insert(rng.randint(0, len(out)), bytes([rng.randrange(256)]))
  return out


def to_tokens(tok, fragments: list, rng: random.Random) -> list[int]:
  """Fragments -> token ids; strings are sometimes split mid-tag first."""
  ids = []
  for f in fragments:
    if isinstance(f, bytes):
      # A vocabulary may lack a byte no text holds (SmolLM2's has no
      # 0xF5-0xFF): no model can generate it.
      ids += [i for b in f if (i := byte_token(tok, b)) is not None]
    elif len(f) > 1 and rng.random() < 0.25:
      cut = rng.randrange(1, len(f))
      ids += tok.encode(f[:cut]) + tok.encode(f[cut:])
    else:
      ids += tok.encode(f)
  return ids[:MAX_TOKENS]


@functools.cache
def _parser(codec_key):
  codec = CODECS[codec_key]
  return jax.jit(jax.vmap(codec.parse))


CODECS: dict = {}


def codec_for(tok_name: str, env_name: str, think: bool) -> codec_lib.Codec:
  key = (tok_name, env_name, think)
  if key not in CODECS:
    settings = prompt_lib.PromptSettings(
      enable_think=think, max_actions_per_turn=3
    )
    spec = envs.make(env_name).spec
    CODECS[key] = codec_lib.Codec.build(TOKENIZERS[tok_name](), spec, settings)
  return CODECS[key]


@pytest.mark.parametrize(
  "tok_name, env_name, think, count",
  [
    ("compact", "sokoban", True, 2_000),
    ("bpe", "sokoban", True, 2_000),
    ("compact", "bandit", False, 1_000),
    # A pretrained model's replies: </think> is several tokens.
    ("smollm2", "frozen_lake", True, 1_000),
  ],
)
def test_jitted_parse_equals_the_regex_reference(
  tok_name, env_name, think, count
):
  count = int(FUZZ_EXAMPLES or count)  # the opt-in run's (test_bad_inputs)
  tok = TOKENIZERS[tok_name]()
  codec = codec_for(tok_name, env_name, think)
  spec = envs.make(env_name).spec
  rng = random.Random(f"{tok_name}{env_name}{think}")
  samples = [to_tokens(tok, random_fragments(rng), rng) for _ in range(count)]
  tokens = np.zeros((count, MAX_TOKENS), np.int32)
  lengths = np.asarray([len(s) for s in samples], np.int32)
  for i, s in enumerate(samples):
    tokens[i, : len(s)] = s
  parse = _parser((tok_name, env_name, think))
  matched_count = valid_count = thought_count = 0
  for lo in range(0, count, 2000):
    got = to_numpy(
      parse(
        jnp.asarray(tokens[lo : lo + 2000]),
        jnp.asarray(lengths[lo : lo + 2000]),
      )
    )
    for j in range(got.matched.shape[0]):
      i = lo + j
      reply = b"".join(tok.token_bytes(t) for t in samples[i])
      # RAGEN prepends the tag the prompt ended with.
      prefix = b"<think>" if think else b"<answer>"
      data = prefix + reply
      matched, actions = ref.parse(
        data,
        think=think,
        markers=codec.markers,
        max_actions=3,
        action_names=spec.action_names,
      )
      assert bool(got.matched[j]) == matched, data
      assert bool(got.thought[j]) == (think and ref.thought(data)), data
      # Reasoning tokens: those starting before the matched "</think>".
      end = ref.think_end(data) if think else None
      starts = np.cumsum([0, *(len(tok.token_bytes(t)) for t in samples[i])])
      want = 0 if end is None else int(np.sum(starts[:-1] + len(prefix) < end))
      assert int(got.think_tokens[j]) == want, data
      thought_count += bool(got.thought[j])
      assert got.num_parts[j] == len(actions), data
      assert list(got.actions[j, : len(actions)]) == actions, data
      assert np.all(got.actions[j, len(actions) :] == -1), data
      matched_count += matched
      valid_count += any(a >= 0 for a in actions)
  # The generator must exercise both outcomes, and valid actions.
  assert 0.2 * count < matched_count < 0.9 * count
  assert valid_count > 0.05 * count
  if think:  # blank and non-blank reasoning both occur
    assert 0.05 * matched_count < thought_count < 0.95 * matched_count


# RAGEN's grammar on exact replies, the expectations written by hand from
# it (the prompt has opened "<answer>"; at most 3 actions a turn here):
# parts split on "||", stripped, empty ones dropped, names matched without
# case, the first answer block only.
EXACT_REPLIES = [
  ("Up || || Left</answer>", True, ["Up", "Left"]),
  ("Up |||| Left</answer>", True, ["Up", "Left"]),
  ("Up ||| Left</answer>", True, ["Up", None]),
  ("||Up||</answer>", True, ["Up"]),
  ("Up || Down || Left</answer>", True, ["Up", "Down", "Left"]),
  ("Up || Down || Left || Right</answer>", True, ["Up", "Down", "Left"]),
  ("up||LEFT</answer>", True, ["Up", "Left"]),
  ("Up , Left</answer>", True, [None]),
  ("</answer>", True, []),
  ("Up</answer> <answer>Down</answer>", True, ["Up"]),
  ("Up || Left", False, []),
]


@pytest.mark.parametrize("tok_name", ["compact", "bpe"])
@pytest.mark.parametrize(("reply", "matched", "names"), EXACT_REPLIES)
def test_the_parser_reads_exact_replies_as_ragens_grammar_says(
  tok_name, reply, matched, names
):
  tok = TOKENIZERS[tok_name]()
  codec_for(tok_name, "sokoban", False)
  spec = envs.make("sokoban").spec
  ids = tok.encode(reply)
  tokens = np.zeros((1, MAX_TOKENS), np.int32)
  tokens[0, : len(ids)] = ids
  got = to_numpy(
    _parser((tok_name, "sokoban", False))(
      jnp.asarray(tokens), jnp.asarray([len(ids)], np.int32)
    )
  )
  want = [-1 if n is None else spec.action_names.index(n) for n in names]
  assert bool(got.matched[0]) == matched
  assert int(got.num_parts[0]) == len(want)
  assert list(got.actions[0, : len(want)]) == want
  assert np.all(got.actions[0, len(want) :] == -1)


@pytest.mark.parametrize("think", [False, True])
def test_text_answers_are_the_reference_answer_bytes(think):
  """An environment with free-text answers (Countdown) gets the answer's
  bytes, markers removed, unsplit; a non-blank one is its one valid part."""
  tok = TOKENIZERS["bpe"]()
  settings = prompt_lib.PromptSettings(
    enable_think=think, max_actions_per_turn=1
  )
  codec = codec_lib.Codec.build(tok, envs.make("countdown").spec, settings)
  rng = random.Random(f"text answers {think}")
  exprs = ["1 + 2", "(3*4)-5", "", "  ", "7||8", "12 / (4 - 4)", "x"]
  samples = []
  for _ in range(1000):
    fragments = random_answer(rng)
    if "<answer>" in fragments:
      at = fragments.index("<answer>") + 1
      fragments.insert(at, rng.choice(exprs))
    samples.append(to_tokens(tok, fragments, rng))
  tokens = np.zeros((len(samples), MAX_TOKENS), np.int32)
  for i, sample in enumerate(samples):
    tokens[i, : len(sample)] = sample
  lengths = np.asarray([len(x) for x in samples], np.int32)
  got = to_numpy(jax.jit(jax.vmap(codec.parse))(tokens, lengths))
  given = blank = 0
  for i, sample in enumerate(samples):
    data = codec.reply_prefix + b"".join(tok.token_bytes(t) for t in sample)
    want = ref.answer(data, think=think, markers=codec.markers)
    assert bool(got.matched[i]) == (want is not None), data
    if want is None:
      assert got.num_parts[i] == 0 and got.actions[i, 0] == -1, data
      continue
    n = int(got.answer_length[i])
    assert bytes(got.answer[i, :n].astype(np.uint8)) == want, data
    nonblank = bool(want.strip(ref.WHITESPACE))
    assert got.num_parts[i] == nonblank, data
    assert got.actions[i, 0] == (0 if nonblank else -1), data
    given += nonblank
    blank += not nonblank
  # Both outcomes occur, and answers that do not match.
  assert given > 0.2 * len(samples) and blank >= 3
  assert given + blank < 0.99 * len(samples)


@pytest.mark.parametrize("mode", prompt_lib.OBSERVATION_TOKENS)
@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
def test_rendered_tokens_are_the_tokenizers_own(tok_name, mode):
  # "text": exactly what the tokenizer gives for the observation's whole
  # text (where it merges bytes); "pieces": each piece's own tokens in a
  # row. Both decode to the text.
  tok = TOKENIZERS[tok_name]()
  settings = dataclasses.replace(SETTINGS, observation_tokens=mode)
  differ = 0
  for name, env in env_variants():
    codec = codec_lib.Codec.build(tok, env.spec, settings)
    states = jax.tree.map(lambda x: x[:64], level_pool(name))

    @jax.jit
    def render(codec, states, env=env):
      pieces, n = jax.vmap(env.render)(states)
      return pieces, n, *codec.render_batch(pieces, n)

    pieces, n, tokens, count = map(np.asarray, render(codec, states))
    for i in range(64):
      text = envs.to_text(env.spec, pieces[i], n[i])
      by_piece = [
        t for p in pieces[i, : n[i]] for t in tok.encode(env.spec.pieces[p])
      ]
      whole = mode == "text" and tok.merges
      got = tokens[i, : count[i]].tolist()
      assert got == (tok.encode(text) if whole else by_piece), (name, text)
      assert tok.decode(got) == text
      differ += by_piece != tok.encode(text)
  # A pretrained BPE merges across pieces ("######" is "####" + "##"),
  # which is what "text" is for.
  assert differ > 0 or tok_name == "compact"


@pytest.mark.parametrize(
  "value", [0.0, -0.1, 0.1, 10.9, -1.1, 1.0, 0.25, -0.3, 0.05, 123.45, -20.0]
)
def test_rewards_are_written_as_the_reference_formats_them(value):
  codec = codec_for("compact", "sokoban", True)
  ids, keep = codec.reward(jnp.float32(value))
  tok = TOKENIZERS["compact"]()
  got = tok.decode(np.asarray(ids)[np.asarray(keep)])
  assert got == ref.format_reward(float(np.float32(value)))
  assert got == prompt_lib.format_reward(float(np.float32(value)))


@pytest.mark.parametrize("style", prompt_lib.PROMPT_STYLES)
def test_turn_chunks_decode_to_the_reference_prompt(style):
  tok = TOKENIZERS["bpe"]()
  env = envs.make("sokoban")
  settings = dataclasses.replace(SETTINGS, style=style)
  codec = codec_lib.Codec.build(tok, env.spec, settings)
  size = codec.turn_chunk_size(5, 10)
  states = jax.tree.map(lambda x: x[:8], level_pool("sokoban"))
  obs = jax.jit(jax.vmap(codec.render))(*jax.vmap(env.render)(states))
  rng = np.random.default_rng(0)
  for i in range(8):
    case = dict(
      turn=int(rng.integers(0, 5)),
      reward=float(np.float32(rng.choice([-0.1, 10.9, -1.2, 0.8]))),
      warn=bool(rng.integers(0, 2)),
      actions_left=int(rng.integers(0, 11)),
      ended_by_stop=bool(rng.integers(0, 2)),
    )
    row = (obs[0][i], obs[1][i])
    ids, count = codec.turn_chunk(
      jnp.int32(case["turn"]),
      row,
      codec_lib.LastTurn(
        jnp.float32(case["reward"]),
        jnp.bool_(case["warn"]),
        jnp.int32(case["actions_left"]),
        jnp.bool_(case["ended_by_stop"]),
      ),
      size,
      5,
      10,
    )
    observation = tok.decode(np.asarray(obs[0][i])[: int(obs[1][i])])
    want = ref.turn_text(
      observation=observation,
      think=True,
      hint=SETTINGS.response_hint,
      compact=style == "compact",
      **case,
    )
    assert tok.decode(np.asarray(ids)[: int(count)]) == want
    assert count <= size


def test_the_compact_prompt_is_short_and_names_the_environment():
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  compact = dataclasses.replace(SETTINGS, style="compact")
  assert prompt_lib.system_text(env.spec, compact) == "sokoban"
  ragen = codec_lib.Codec.build(tok, env.spec, SETTINGS).turn_chunk_size(5, 10)
  short = codec_lib.Codec.build(tok, env.spec, compact).turn_chunk_size(5, 10)
  assert short < ragen / 2
  with pytest.raises(ValueError, match="style"):
    prompt_lib.PromptSettings(style="terse")


def test_system_prompt_lists_instructions_legend_and_actions():
  spec = envs.make("sokoban").spec
  system = prompt_lib.system_text(spec, SETTINGS)
  assert system.startswith("You're a helpful assistant. You are solving")
  assert "#: wall, _: empty, O: target" in system
  assert "Up, Down, Left, Right" in system
  assert "up to 2 actions" in system
  bandit = prompt_lib.system_text(envs.make("bandit").spec, SETTINGS)
  assert "available actions" not in bandit


@pytest.mark.parametrize("tok_name", sorted(TOKENIZERS))
def test_stop_automaton_finds_answer_close_split_across_tokens(tok_name):
  tok = TOKENIZERS[tok_name]()
  codec = codec_for(tok_name, "sokoban", True)
  rng = random.Random(tok_name)
  step = jax.jit(lambda c, s, t: c.stop_step(s, t))
  hits = 0
  for _ in range(300):
    ids = to_tokens(tok, random_fragments(rng), rng)
    state = jnp.int32(0)
    seen = b""
    for t in ids:
      state, hit = step(codec, state, jnp.int32(t))
      before = len(seen)
      seen += tok.token_bytes(t)
      # A hit exactly when an occurrence of "</answer>" ends in this token.
      ends = [m.end() for m in re.finditer(rb"</answer>", seen)]
      assert bool(hit) == any(e > before for e in ends), seen
      hits += bool(hit)
  assert hits > 50
