"""Rollout work a serving engine skips, and the measure of what is left:
the shared prompt prefilled once (``rollout.share_prefix``) and the decode
slots finished rows take (``diagnostics.decode_waste``)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

import envs
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo import diagnostics
from starpo_jax.models import presets, transformer
from tests.envs.conftest import to_numpy
from tests.helpers import TRACES, counted
from tests.text_fixtures import TOKENIZERS

CFG = rollout.RolloutConfig(
  env_groups=3,
  group_size=2,
  max_turns=2,
  max_new_tokens=12,
  max_context=1024,
)


class Spy:
  """The model, recording how many rows each prefill it runs has (and
  each decode step, in ``decoded``)."""

  depends_on_row = False

  def __init__(self, model, seen, decoded=None):
    self.model, self.seen = model, seen
    self.decoded = [] if decoded is None else decoded

  def for_decoding(self):
    return Spy(self.model.for_decoding(), self.seen, self.decoded)

  def init_cache(self, batch, size):
    return self.model.init_cache(batch, size)

  def hidden(self, tokens, cache, num_new=None, at=None):
    jax.debug.callback(lambda: self.seen.append(tokens.shape[0]))
    return self.model.hidden(tokens, cache, num_new, at=at)

  def logits(self, h):
    return self.model.logits(h)

  def __call__(self, tokens, cache, num_new=None):
    jax.debug.callback(lambda: self.decoded.append(tokens.shape[0]))
    return self.model(tokens, cache, num_new)


@functools.cache
def played(tok_name: str, env_name: str, think: bool, share: bool):
  tok = TOKENIZERS[tok_name]()
  env = envs.make(env_name)
  cfg = dataclasses.replace(CFG, enable_think=think, share_prefix=share)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  seen = []
  play = jax.jit(lambda m, c, k: rollout.rollout(Spy(m, seen), c, env, cfg, k))
  traj = to_numpy(play(model, codec, jax.random.key(5)))
  return traj, seen, tok, codec


def first_prompts(traj, tok) -> list[str]:
  """Each episode's first turn's prompt, as text."""
  first = (traj.turn_ids == 0) & ~traj.loss_mask
  return [tok.decode(t[m]) for t, m in zip(traj.tokens, first, strict=True)]


@pytest.mark.parametrize(
  ("tok_name", "env_name", "think"),
  [
    ("smollm2", "sokoban", True),
    ("bpe", "frozen_lake", False),
    ("compact", "sokoban", False),
    ("compact", "bandit", True),
  ],
)
def test_a_shared_prefix_prefilled_once_equals_every_episode_prefilling_it(
  tok_name, env_name, think
):
  shared, seen, tok, _ = played(tok_name, env_name, think, True)
  alone, seen_alone, _, _ = played(tok_name, env_name, think, False)
  b, groups = CFG.batch, CFG.env_groups
  # What was prefilled: the system message once, then each group's first
  # prompt once, then every episode's second; each episode prefills its
  # own without sharing.
  assert seen == [1, groups, b]
  assert seen_alone == [b, b, b]
  # Groups differ in their first prompt; members share it.
  prompts = first_prompts(shared, tok)
  assert len(set(prompts)) == groups
  assert prompts[::2] == prompts[1::2]
  # Same tokens sampled under the same key, same log-probabilities and
  # entropies (the whole next-token distribution) at every position.
  np.testing.assert_array_equal(shared.tokens, alone.tokens)
  assert shared.loss_mask.sum() > 4 * b
  np.testing.assert_allclose(shared.logprobs, alone.logprobs, atol=2e-5)
  np.testing.assert_allclose(shared.entropy, alone.entropy, atol=2e-5)


def test_groups_whose_shared_text_ends_inside_a_merged_token_still_share():
  # Sokoban levels all start with a wall row, so two groups' first
  # observations agree on a stretch of text that ends inside a token
  # SmolLM2's BPE merged ("######" is "####" + "##") in one of them:
  # sharing is decided on tokens (whole prompts of one group), never on a
  # text prefix.
  shared, _, tok, _ = played("smollm2", "sokoban", True, True)
  alone = played("smollm2", "sokoban", True, False)[0]
  texts = first_prompts(shared, tok)
  first = (shared.turn_ids == 0) & ~shared.loss_mask
  inside = []
  for i, j in ((0, 2), (2, 0), (0, 4), (4, 0), (2, 4), (4, 2)):
    pairs = zip(texts[i], texts[j], strict=False)
    n = next((k for k, (x, y) in enumerate(pairs) if x != y), 0)
    common = texts[i][:n]
    prefix = tok.encode(common)
    tokens = list(shared.tokens[i][first[i]])
    inside.append(tokens[: len(prefix)] != prefix)
  assert any(inside)
  np.testing.assert_allclose(shared.logprobs, alone.logprobs, atol=2e-5)


@pytest.mark.parametrize(
  ("differ", "turn", "rows"), [(False, 0, 2), (True, 0, 6), (False, 1, 6)]
)
def test_a_group_prefills_once_only_when_that_is_exact(differ, turn, rows):
  # Members of a group prefill once only on the first turn (their caches
  # then hold the same system prompt) and only when their prompts are the
  # same tokens; otherwise every row prefills its own.
  from starpo_jax.agent.turn import prefill

  model = transformer.create(presets.preset("tiny", vocab_size=64))
  cfg = rollout.RolloutConfig(env_groups=2, group_size=3)
  rng = np.random.default_rng(0)
  prompt = np.repeat(rng.integers(1, 64, (2, 7)), 3, axis=0)
  num = np.full((6,), 7)
  if differ:
    prompt[4, 6] = (prompt[4, 6] + 1) % 64  # the last member of group 2
  system = rng.integers(1, 64, (1, 5))
  _, cache = model.hidden(system, model.init_cache(1, 32))
  cache = cache.broadcast(6)
  seen = []
  h, got = jax.jit(
    lambda m, p, c, n, t: prefill(Spy(m, seen), cfg, p, c, n, t)
  )(model, prompt, cache, num, turn)
  want_h, want = model.hidden(prompt, cache, num)
  assert seen == [rows]
  np.testing.assert_allclose(h, want_h, atol=1e-5)
  for a, b in zip(got.k + got.v, want.k + want.v, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)
  np.testing.assert_array_equal(got.length, want.length)


SHRINK = rollout.RolloutConfig(
  env_groups=4,
  group_size=4,
  max_turns=4,
  max_actions_per_traj=6,
  max_new_tokens=24,
  max_context=768,
  enable_think=False,
  answer_vocab=True,
)


@functools.cache
def shrink_runner(shrinks: int):
  env = envs.make("frozen_lake")
  cfg = dataclasses.replace(SHRINK, decode_shrinks=shrinks)
  decoded = []
  fn = counted(
    f"shrinks{shrinks}",
    lambda m, c, k: rollout.rollout(Spy(m, [], decoded), c, env, cfg, k),
  )
  return jax.jit(fn), decoded


def test_decoding_the_live_rows_gathered_equals_the_lockstep_batch():
  # Replies of random lengths (a random model restricted to the answer's
  # tokens closes its answer early or late) and episodes that end at
  # different turns (in holes, at the goal): the batch halves twice as
  # rows finish, yet every token, log-probability and reward is the
  # lockstep batch's.
  tok = TOKENIZERS["compact"]()
  codec = codec_lib.Codec.build(
    tok, envs.make("frozen_lake").spec, SHRINK.prompt_settings()
  )
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  live = set()
  for seed in (0, 1):
    key = jax.random.key(seed)
    lock = to_numpy(shrink_runner(0)[0](model, codec, key))
    gathered = to_numpy(shrink_runner(2)[0](model, codec, key))
    for name in ("tokens", "length", "loss_mask", "turn_rewards", "success"):
      np.testing.assert_array_equal(
        getattr(gathered, name), getattr(lock, name), err_msg=name
      )
    np.testing.assert_allclose(gathered.logprobs, lock.logprobs, atol=1e-5)
    np.testing.assert_array_equal(gathered.decode_steps, lock.decode_steps)
    # Fewer slots decoded, so fewer of them idle.
    waste = lambda t: {
      k: float(v) for k, v in diagnostics.decode_waste(t).items()
    }
    w_lock, w_gathered = waste(lock), waste(gathered)
    assert w_lock["decode_idle"] == pytest.approx(
      w_lock["decode_finished_reply"] + w_lock["decode_finished_episode"]
    )
    assert w_gathered["decode_idle"] < w_lock["decode_idle"] - 0.05
    # Rows finish at different steps.
    lengths = lock.response_lengths[lock.turn_played]
    assert lengths.min() < SHRINK.max_new_tokens // 2 < lengths.max()
    live.add(tuple(lock.turn_played.sum(0)))
  # Episodes end at different turns; batches with different live counts,
  # one compile.
  assert min(min(n) for n in live) < SHRINK.batch
  assert len(live) == 2
  assert TRACES["shrinks2"] == 1
  # The whole batch decoded, then halves of it, then quarters.
  assert set(shrink_runner(0)[1]) == {SHRINK.batch}
  assert set(shrink_runner(2)[1]) == {SHRINK.batch, 8, 4}


def test_the_decode_waste_is_the_share_of_slots_finished_rows_took():
  # Reference: a turn decodes until its longest reply ends, each step a
  # slot for every row; the rest of a played reply's slots, and all of an
  # unplayed turn's, are waste.
  traj = to_numpy(
    shrink_runner(0)[0](
      transformer.create(
        presets.preset("tiny", vocab_size=TOKENIZERS["compact"]().vocab_size)
      ),
      codec_lib.Codec.build(
        TOKENIZERS["compact"](),
        envs.make("frozen_lake").spec,
        SHRINK.prompt_settings(),
      ),
      jax.random.key(0),
    )
  )
  b, k = traj.turn_played.shape
  slots = reply = episode = 0
  for t in range(k):
    steps = max(int(traj.response_lengths[r, t]) for r in range(b))
    slots += steps * b
    for r in range(b):
      if traj.turn_played[r, t]:
        reply += steps - int(traj.response_lengths[r, t])
      else:
        episode += steps
  got = {key: float(v) for key, v in diagnostics.decode_waste(traj).items()}
  assert reply > 0 and episode > 0
  assert got["decode_finished_reply"] == pytest.approx(reply / slots)
  assert got["decode_finished_episode"] == pytest.approx(episode / slots)


@pytest.mark.parametrize("buffers", ["auto", "on", "off"])
def test_layer_buffers_decode_the_tokens_the_stacked_weights_do(buffers):
  # On this CPU "auto" means on: the rollout decodes from one buffer per
  # layer (``for_decoding``), and plays what slicing at every call plays.
  tok = TOKENIZERS["compact"]()
  env = envs.make("sokoban")
  cfg = dataclasses.replace(CFG, enable_think=False, layer_buffers=buffers)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  model = transformer.create(presets.preset("tiny", vocab_size=tok.vocab_size))
  buffered = []

  class Watch(Spy):
    def for_decoding(self):
      buffered.append(True)
      return super().for_decoding()

  def play(cfg):
    run = jax.jit(lambda m, c, k: rollout.rollout(Watch(m, []), c, env, cfg, k))
    return to_numpy(run(model, codec, jax.random.key(3)))

  got = play(cfg)
  assert buffered == ([] if buffers == "off" else [True])
  buffered.clear()
  plain = play(dataclasses.replace(cfg, layer_buffers="off"))
  assert not buffered
  np.testing.assert_array_equal(got.tokens, plain.tokens)
  np.testing.assert_allclose(got.logprobs, plain.logprobs, atol=1e-5)
