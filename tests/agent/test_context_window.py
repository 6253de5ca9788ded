"""Context-window modes (``rollout.context_window``): each reply is sampled,
re-scored and trained seeing the system prompt and the last k turns.

The references know nothing of the masks: attention written in NumPy from
the rule, and a Hugging Face model (``transformers``) scoring a plain-Python
rendering of the visible turns (``reference/context.py``), cut from the
trajectory by its replies alone (a turn runs from the end of the previous
reply to the end of its own): at the tokens' places in the episode
(masked), or as a prompt of its own (re-prefilled).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import envs
from reference import context
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo import logprobs, update
from starpo_jax.algo.batch import Batch
from starpo_jax.algo.config import AlgoConfig
from starpo_jax.algo.experts import ScriptedPolicy
from starpo_jax.algo.spec import StepSpec
from starpo_jax.models import attention, hf, presets, transformer
from tests.text_fixtures import TOKENIZERS

# --------------------------------------------------------------------------
# Attention with a turn window, against NumPy


def turns_of(lengths: list[int], system: int, pad: int) -> np.ndarray:
  """Turn ids: ``system`` tokens of -1, turn i of ``lengths[i]`` tokens,
  then ``pad`` tokens of -1."""
  ids = [-1] * system
  for i, n in enumerate(lengths):
    ids += [i] * n
  return np.asarray(ids + [-1] * pad, np.int32)


def numpy_attention(q, k, v, turns, size):
  """Causal attention where a token sees the system prompt and the last
  ``size`` turns (its own included), one sequence: ``[T, N, H]``."""
  t, n, h = q.shape
  rep = n // k.shape[1]
  k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
  out = np.zeros_like(q)
  for i in range(t):
    seen = [
      j for j in range(i + 1) if turns[j] < 0 or turns[i] - size < turns[j]
    ]
    s = np.einsum("nh,snh->ns", q[i], k[seen]) / np.sqrt(h)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out[i] = np.einsum("ns,snh->nh", p, v[seen])
  return out


@pytest.mark.parametrize("size", [1, 2])
def test_training_kernels_hide_the_turns_outside_the_window(size):
  rng = np.random.default_rng(size)
  # Over one 128-token block, so the blockwise kernel's blocks are crossed.
  turns = np.stack(
    [turns_of([40, 55, 30, 60], 9, 6), turns_of([70, 20, 50, 45], 9, 6)]
  )
  b, t = turns.shape
  q = rng.normal(size=(b, t, 4, 8)).astype(np.float32)
  k = rng.normal(size=(b, t, 2, 8)).astype(np.float32)
  v = rng.normal(size=(b, t, 2, 8)).astype(np.float32)
  want = np.stack(
    [numpy_attention(q[i], k[i], v[i], turns[i], size) for i in range(b)]
  )
  window = attention.TurnWindow(jnp.asarray(turns), size)
  for kernel in ("xla", "blockwise"):
    got = attention.causal(q, k, v, kernel, window)
    np.testing.assert_allclose(got, want, atol=2e-5, err_msg=kernel)
  # Gradients of the blockwise kernel's own backward pass, against XLA's.
  w = rng.normal(size=q.shape).astype(np.float32)
  grads = {
    kernel: jax.grad(
      lambda q, k, v, kernel=kernel: jnp.sum(
        attention.causal(q, k, v, kernel, window) * w
      ),
      argnums=(0, 1, 2),
    )(q, k, v)
    for kernel in ("xla", "blockwise")
  }
  for got, want in zip(grads["blockwise"], grads["xla"], strict=True):
    np.testing.assert_allclose(got, want, atol=5e-5)
  with pytest.raises(ValueError, match=r"splash.*context window"):
    attention.causal(q, k, v, "splash", window)


@pytest.mark.parametrize("queries", [1, 5])
def test_cached_attention_hides_its_span(queries):
  rng = np.random.default_rng(queries)
  b, size, kv, n, h = 2, 300, 2, 4, 8
  q = rng.normal(size=(b, queries, n, h)).astype(np.float32)
  k = rng.normal(size=(b, kv, size, h)).astype(np.float32)
  v = rng.normal(size=(b, kv, size, h)).astype(np.float32)
  positions = np.array([[250], [180]]) + np.arange(queries)
  hidden = np.array([[7, 200], [7, 7]], np.int32)  # the second hides none
  got = attention.cached(q, k, v, jnp.asarray(positions), jnp.asarray(hidden))
  for i in range(b):
    for j in range(queries):
      seen = [
        s
        for s in range(positions[i, j] + 1)
        if not hidden[i, 0] <= s < hidden[i, 1]
      ]
      keys = np.repeat(k[i].transpose(1, 0, 2)[seen], n // kv, axis=1)
      vals = np.repeat(v[i].transpose(1, 0, 2)[seen], n // kv, axis=1)
      s = np.einsum("nh,snh->ns", q[i, j], keys) / np.sqrt(h)
      p = np.exp(s - s.max(-1, keepdims=True))
      want = np.einsum("ns,snh->nh", p / p.sum(-1, keepdims=True), vals)
      np.testing.assert_allclose(got[i, j], want, atol=2e-5)


# --------------------------------------------------------------------------
# Rollouts in each mode, re-scored


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory):
  """A tiny random Qwen2 checkpoint over the compact tokenizer's
  vocabulary: our model loads it, ``transformers`` runs it."""
  tok = TOKENIZERS["compact"]()
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
    vocab_size=tok.vocab_size,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    initializer_range=0.3,
  )
  path = str(tmp_path_factory.mktemp("qwen2"))
  transformers.Qwen2ForCausalLM(cfg).eval().save_pretrained(path)
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(
    path, dtype=torch.float32
  ).eval()
  return tok, hf.load(path), torch_model


@functools.cache
def tiny_model(vocab: int):
  return transformer.create(presets.preset("tiny", vocab_size=vocab))


CFG = rollout.RolloutConfig(
  env_groups=2,
  group_size=2,
  max_turns=3,
  max_new_tokens=10,
  max_context=512,
  temperature=1.0,
)


@functools.cache
def played(mode: str, turns: int, model, tok, method: str = "mask"):
  cfg = dataclasses.replace(
    CFG, context_window=mode, context_turns=turns, context_method=method
  )
  env = envs.make("sokoban")
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  play = jax.jit(lambda m, c, k: rollout.rollout(m, c, env, cfg, k))
  return cfg, codec, play(model, codec, jax.random.key(4))


def turns_of_row(traj, row: int, system: int) -> np.ndarray:
  """Row ``row``'s turns, cut at its replies' ends (``reference``)."""
  return context.turns_by_replies(np.asarray(traj.loss_mask[row]), system)


def hf_logprobs(torch_model, tokens, temperature, allowed, **kwargs):
  """Log-probabilities of ``tokens[1:]`` under ``transformers`` (``kwargs``:
  its ``position_ids``, ``attention_mask``)."""
  kwargs = {k: torch.as_tensor(np.array(v)) for k, v in kwargs.items()}
  with torch.no_grad():
    logits = torch_model(
      input_ids=torch.as_tensor(np.array(tokens[None]), dtype=torch.long),
      **kwargs,
    ).logits[0]
  logits = logits.numpy() / temperature
  if allowed is not None:
    logits = np.where(np.asarray(allowed), logits, -np.inf)
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return logp[np.arange(len(tokens) - 1), tokens[1:]]


@pytest.mark.parametrize(
  "mode, turns, window",
  [("limited", 2, 2), ("single_turn", 3, 1), ("full", 3, 0)],
)
def test_replies_are_sampled_seeing_only_the_visible_turns(
  hf_policy, mode, turns, window
):
  tok, model, torch_model = hf_policy
  cfg, codec, traj = played(mode, turns, model, tok)
  assert cfg.visible_turns == window
  assert np.asarray(traj.num_turns).min() == CFG.max_turns
  system = len(codec.fragments.system)
  recorded = np.asarray(traj.logprobs)
  rescore = functools.partial(
    hf_logprobs, torch_model, temperature=cfg.temperature, allowed=codec.allowed
  )
  for row in range(CFG.batch):
    length = int(traj.length[row])
    tokens = np.asarray(traj.tokens[row, :length])
    turns = turns_of_row(traj, row, system)[:length]
    generated = np.asarray(traj.loss_mask[row, 1:length])
    want = recorded[row, 1:length][generated]
    # The whole episode, each token seeing what the rule lets it see.
    seen = context.visible(turns, window)
    got = rescore(tokens, attention_mask=seen[None, None])
    np.testing.assert_allclose(want, got[generated], atol=1e-4)
    # The prompt of the last turn: the system prompt and the visible turns.
    last = CFG.max_turns - 1
    places = np.flatnonzero(seen[np.flatnonzero(turns == last)[-1]])
    users = tok.decode(tokens[places]).count("<|im_start|>user")
    assert users == (window or CFG.max_turns)
    if window == 1:
      # Alone with the system prompt, each turn is exactly that rendering
      # (at its places in the episode): nothing hidden reaches it.
      for turn in range(CFG.max_turns):
        places = context.rendered(turns, turn, 1)
        got = rescore(
          tokens[places],
          position_ids=places[None],
          attention_mask=np.ones((1, len(places)), np.int64),
        )
        mask = np.asarray(traj.loss_mask[row])[places[1:]]
        np.testing.assert_allclose(
          recorded[row][places[1:]][mask], got[mask], atol=1e-4
        )


@pytest.mark.parametrize("mode, turns", [("limited", 2), ("single_turn", 3)])
def test_a_reprefilled_reply_sees_its_re_rendered_prompt(
  hf_policy, mode, turns
):
  """``context_method="reprefill"``: each turn's reply is scored by
  ``transformers`` on a prompt of its own, the system prompt and the
  visible turns cut from the episode by the replies, at positions 0, 1,
  ... (RAGEN's re-rendering), nothing else."""
  tok, model, torch_model = hf_policy
  cfg, codec, traj = played(mode, turns, model, tok, "reprefill")
  window = cfg.visible_turns
  system = len(codec.fragments.system)
  recorded = np.asarray(traj.logprobs)
  for row in range(CFG.batch):
    length = int(traj.length[row])
    tokens = np.asarray(traj.tokens[row, :length])
    turn_of = turns_of_row(traj, row, system)[:length]
    generated = np.asarray(traj.loss_mask[row, :length])
    for turn in range(int(traj.num_turns[row])):
      places = context.rendered(turn_of, turn, window)
      prompt = tok.decode(tokens[places])
      assert prompt.count("<|im_start|>user") == min(turn + 1, window)
      got = hf_logprobs(
        torch_model, tokens[places], cfg.temperature, codec.allowed
      )
      mine = generated[places[1:]] & (turn_of[places[1:]] == turn)
      np.testing.assert_allclose(
        recorded[row][places[1:]][mine], got[mine], atol=1e-4
      )


@pytest.mark.parametrize(
  "mode, turns, method",
  [
    ("limited", 2, "mask"),
    ("single_turn", 3, "mask"),
    ("limited", 2, "reprefill"),
    ("single_turn", 3, "reprefill"),
  ],
)
def test_the_update_scores_each_reply_in_the_context_it_was_sampled_in(
  mode, turns, method
):
  # The tiny preset's logits are small enough for float32 to hold 1e-5.
  tok = TOKENIZERS["compact"]()
  model = tiny_model(tok.vocab_size)
  cfg, codec, traj = played(mode, turns, model, tok, method)
  spec = StepSpec(None, cfg, AlgoConfig(), None, None)
  dist = spec.distribution(codec)
  assert dist.window == cfg.visible_turns
  assert (dist.width > 0) == (method == "reprefill")
  positions, mask = logprobs.pack_generated(traj, cfg.max_generated)
  recorded = jnp.take_along_axis(traj.logprobs, positions, 1)
  zeros = jnp.zeros_like(recorded)
  batch = Batch(
    tokens=traj.tokens,
    turns=traj.turn_ids,
    positions=positions,
    mask=mask,
    old_logp=recorded,
    ref_logp=zeros,
    advantages=zeros + 1.0,
    returns=zeros,
    values=zeros,
    episode=jnp.arange(cfg.batch, dtype=jnp.int32),
  )
  graph, params = nnx.split(model)

  def score(dist):
    logp, _ = logprobs.sequence_logprobs(
      model,
      batch.tokens,
      positions,
      dist.temperature,
      dist.allowed,
      64,
      dist.context(batch.turns),
    )
    _, stats = update.policy_objective(params, graph, batch, AlgoConfig(), dist)
    return np.abs(np.asarray(logp - recorded))[np.asarray(mask)], stats

  gap, stats = score(dist)
  assert gap.max() < 1e-5
  assert abs(float(stats["approx_kl"])) < 1e-6
  # Scored seeing every turn, the same replies are other tokens' odds.
  gap, stats = score(dataclasses.replace(dist, window=0))
  assert gap.max() > 1e-2
  assert abs(float(stats["approx_kl"])) > 1e-4


def test_a_script_plays_the_same_episodes_in_every_window():
  # The warm start's experts (ScriptedPolicy) emit what they emit whatever
  # they are shown: a window changes none of their episodes.
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  replies = [["Up || Left</answer>", "Down</answer>", "Right</answer>"]] * 4
  rows = [tok.encode("".join(r)) for r in replies]
  script = ScriptedPolicy(jnp.asarray(rows, jnp.int32), tok.vocab_size)
  played = {}
  for mode in ("full", "single_turn"):
    cfg = dataclasses.replace(CFG, context_window=mode)
    codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
    played[mode] = jax.jit(
      lambda p, c, k, cfg=cfg: rollout.rollout(p, c, env, cfg, k)
    )(script, codec, jax.random.key(1))
  for got, want in zip(
    jax.tree.leaves(played["single_turn"]),
    jax.tree.leaves(played["full"]),
    strict=True,
  ):
    np.testing.assert_array_equal(got, want)
  assert np.asarray(played["full"].turn_played).sum() > 4


def test_context_window_settings_are_checked():
  with pytest.raises(ValueError, match="context_window='recent'"):
    rollout.RolloutConfig(context_window="recent")
  with pytest.raises(ValueError, match="context_turns must be a positive"):
    rollout.RolloutConfig(context_window="limited", context_turns=0)
  assert rollout.RolloutConfig().visible_turns == 0
  assert rollout.RolloutConfig(context_window="single_turn").visible_turns == 1
  with pytest.raises(ValueError, match="'full' hides none"):
    rollout.RolloutConfig(context_method="reprefill")
  with pytest.raises(ValueError, match="context_method='again'"):
    rollout.RolloutConfig(context_window="limited", context_method="again")
