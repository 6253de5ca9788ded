"""One turn of the compiled rollout, for the whole batch: render and
prefill the turn's prompt (``prompt``), decode the reply (``decode``),
run its tool calls (``call_tools``), play its actions in the environment
(``act``); ``scoring.end_turn`` then scores it. ``rollout.py`` scans
these over the turns."""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

import envs
from envs import BatchEnv
from envs.tools import Results
from starpo_jax.agent.codec import Codec, LastTurn
from starpo_jax.agent.parse import Parsed
from starpo_jax.agent.ragged import pack
from starpo_jax.agent.rollout_config import RolloutConfig
from starpo_jax.models import sampling


@struct.dataclass
class Carry:
  states: object  # environment states, [B, ...]
  cache: Any
  tokens: jax.Array  # [B, W]
  loss_mask: jax.Array  # [B, W]
  turn_ids: jax.Array  # [B, W]
  logprobs: jax.Array  # [B, W]
  entropy: jax.Array  # [B, W]
  rewards: jax.Array  # [B, W]
  done: jax.Array  # [B]
  used: jax.Array  # [B] actions executed
  last_reward: jax.Array  # [B]
  warn: jax.Array  # [B]
  ended_by_stop: jax.Array  # [B]
  terminated: jax.Array  # [B]
  success: jax.Array  # [B]
  context_truncated: jax.Array  # [B]
  result: jax.Array  # [B, R] a tool's result, for the next observation
  result_length: jax.Array  # [B] its tokens; 0: no result to show
  results_cut: jax.Array  # [B] tool results cut to their budget
  turn_start: jax.Array  # [B, K] where each turn's prompt begins
  key: jax.Array


@struct.dataclass
class Decode:
  step: jax.Array  # []
  slots: jax.Array  # [] rows decoded so far, summed over steps
  logits: jax.Array  # [B, V] for the next token
  live: jax.Array  # [B]
  stop_state: jax.Array  # [B] "</answer>" automaton
  tool_state: jax.Array  # [B] "</tool>" automaton (tools only)
  reply: jax.Array  # [B, T]
  count: jax.Array  # [B] tokens generated this turn
  last: jax.Array  # [B] last token generated
  cache: Any
  tokens: jax.Array  # [B, W]
  loss_mask: jax.Array  # [B, W]
  logprobs: jax.Array  # [B, W]
  entropy: jax.Array  # [B, W]
  turn_ids: jax.Array  # [B, W]
  rows: jax.Array  # [B] each row's place in the batch (its sampling key)
  key: jax.Array


@struct.dataclass
class Prompted:
  """A turn after its prompt chunk was prefilled."""

  active: jax.Array  # [B] the episode plays this turn
  fits: jax.Array  # [B] the chunk and one token fit the context
  context_truncated: jax.Array  # [B] so far, this turn included
  decode: Decode  # the decode loop's starting state


@struct.dataclass
class Acting:
  """The action scan's carry: one turn's parsed actions played in order."""

  states: object  # environment states, [B, ...]
  used: jax.Array  # [B] actions executed in the episode
  env_done: jax.Array  # [B] the environment ended during this turn
  reward: jax.Array  # [B] the turn's environment reward
  effective: jax.Array  # [B] some action changed the state
  success: jax.Array  # [B]
  terminated: jax.Array  # [B]
  unavailable: jax.Array  # [B] parts naming an action not offered here
  executed: jax.Array  # [A, B] the actions executed, -1 where none was


@struct.dataclass
class Reply:
  """A turn's replies: decoded, parsed, and their tool calls run (None:
  the environment has no tools)."""

  decoded: Decode
  parsed: Parsed
  calls: Results | None


def write(buffer: jax.Array, start: jax.Array, block: jax.Array, keep):
  """Row-wise ``buffer[b, start[b]:start[b]+w] = block[b]`` where ``keep``."""

  def one(row, s, new, k):
    old = jax.lax.dynamic_slice(row, (s,), new.shape)
    return jax.lax.dynamic_update_slice(row, jnp.where(k, new, old), (s,))

  return jax.vmap(one)(buffer, start, block, keep)


def set_at(buffer: jax.Array, pos: jax.Array, value: jax.Array, keep):
  """Row-wise ``buffer[b, pos[b]] = value[b]`` where ``keep``."""
  rows = jnp.arange(buffer.shape[0])
  pos = jnp.clip(pos, 0, buffer.shape[1] - 1)
  return buffer.at[rows, pos].set(jnp.where(keep, value, buffer[rows, pos]))


class Policy(Protocol):
  """What the rollout needs of a model (``Transformer`` is one).

  ``depends_on_row``: whether a row's output depends on its row and not
  only on its tokens and cache (a scripted policy's does); the rollout
  then prefills every row itself. ``for_decoding()``: the policy as the
  rollout's loops should hold it (``RolloutConfig.layer_buffers``)."""

  depends_on_row: bool

  def for_decoding(self) -> Policy: ...

  def init_cache(self, batch: int, size: int) -> Any: ...

  def hidden(
    self, tokens, cache, num_new=None, at=None
  ) -> tuple[jax.Array, Any]: ...

  def logits(self, h: jax.Array) -> jax.Array: ...

  def __call__(self, tokens, cache, num_new=None) -> tuple[jax.Array, Any]: ...


def prompt(
  model: Policy,
  codec: Codec,
  env: BatchEnv,
  cfg: RolloutConfig,
  carry: Carry,
  turn: jax.Array,
  chunk: int,
) -> Prompted:
  """Renders each live episode's turn prompt, writes it after the context
  and prefills it; the next token's logits start the decode."""
  b, length = cfg.batch, cfg.max_context
  obs = observations(codec, env, carry)
  left = cfg.max_actions_per_traj - carry.used
  previous = LastTurn(carry.last_reward, carry.warn, left, carry.ended_by_stop)
  prompt, count = jax.vmap(
    lambda o, last: codec.turn_chunk(
      turn, o, last, chunk, cfg.max_turns, cfg.max_actions_per_traj
    )
  )(obs, previous)
  start = carry.cache.length
  fits = start + count + 1 <= length
  active = ~carry.done & fits
  ids = jnp.where(jnp.arange(chunk) < count[:, None], turn, -1)
  cache = carry.cache
  if cfg.visible_turns:
    cache = cache.replace(hidden=hidden_turns(codec, cfg, carry, turn))
  if cfg.context_method == "reprefill":
    cache = reprefill(model, cfg, carry.tokens, cache, chunk)
  with jax.named_scope("prefill"):
    last = jnp.maximum(count - 1, 0)[:, None]
    last_h, cache = prefill(
      model, cfg, prompt, cache, jnp.where(active, count, 0), turn, last
    )
  zero = jnp.zeros((b,), jnp.int32)
  return Prompted(
    active=active,
    fits=fits,
    context_truncated=carry.context_truncated | (~carry.done & ~fits),
    decode=Decode(
      step=jnp.zeros((), jnp.int32),
      slots=jnp.zeros((), jnp.int32),
      logits=model.logits(last_h)[:, 0],
      live=active,
      stop_state=zero,
      tool_state=zero,
      reply=jnp.zeros((b, cfg.max_new_tokens), jnp.int32),
      count=zero,
      last=zero,
      cache=cache,
      tokens=write(carry.tokens, start, prompt, active[:, None]),
      loss_mask=carry.loss_mask,
      logprobs=carry.logprobs,
      entropy=carry.entropy,
      turn_ids=write(carry.turn_ids, start, ids, active[:, None]),
      rows=jnp.arange(b, dtype=jnp.int32),
      key=carry.key,
    ),
  )


def hidden_turns(
  codec: Codec, cfg: RolloutConfig, carry: Carry, turn: jax.Array
) -> jax.Array:
  """``[B, 2]``: the cache slots turn ``turn`` does not see, those of the
  turns before the last ``cfg.visible_turns`` (from the system prompt's
  end to where the first visible turn begins; an empty span while every
  turn is visible)."""
  first = turn - cfg.visible_turns + 1
  system = len(codec.fragments.system)
  # This turn begins where the context ends; earlier ones were recorded.
  begins = jnp.where(
    first == turn,
    carry.cache.length,
    carry.turn_start[:, jnp.clip(first, 0, carry.turn_start.shape[1] - 1)],
  )
  end = jnp.where(first > 0, begins, system)
  return jnp.stack([jnp.full_like(end, system), end], axis=1)


def reprefill(
  model: Policy, cfg: RolloutConfig, tokens: jax.Array, cache: Any, chunk: int
) -> Any:
  """``cache`` as a prompt of the system prompt and this turn's visible
  turns would have it (``context_method="reprefill"``): new tokens' rotary
  positions trail their slots by the hidden span's length, so the visible
  turns follow the system prompt; the earlier visible turns (``limited``
  with more than one) are prefilled again in their slots from ``tokens
  [B, W]``, under this turn's window and positions. Rows that hide
  nothing keep their states, which saw what they see now."""
  hidden = cache.hidden
  shift = jnp.maximum(hidden[:, 1] - hidden[:, 0], 0)
  cache = cache.replace(shift=shift)
  width = (cfg.visible_turns - 1) * (chunk + cfg.max_new_tokens)
  if not width:
    return cache
  begin, end = hidden[:, 1], cache.length
  redo = (shift > 0) & (end > begin)
  at = jnp.clip(begin[:, None] + jnp.arange(width), 0, tokens.shape[1] - 1)
  again = jnp.take_along_axis(tokens, at, axis=1)
  # A row with nothing to redo writes its padding past its end, where the
  # turn's prompt is written next.
  start = jnp.where(redo, begin, end)
  # Only the cache is wanted: the last layer's output at one token.
  _, cache = model.hidden(
    again,
    cache.replace(length=start),
    jnp.where(redo, end - begin, 0),
    at=jnp.zeros((again.shape[0], 1), jnp.int32),
  )
  return cache


def observations(
  codec: Codec, env: BatchEnv, carry: Carry
) -> tuple[jax.Array, jax.Array]:
  """What each episode is shown this turn, as tokens and their count:
  its observation, after the last turn's tool result where it has one."""
  obs = codec.render_batch(*env.render(carry.states))
  if codec.tools is None:
    return obs
  return jax.vmap(
    lambda r, rn, o, on: pack(
      [
        (r, jnp.arange(r.shape[0]) < rn),
        (o, jnp.arange(o.shape[0]) < on),
      ],
      codec.obs_width,
    )
  )(carry.result, carry.result_length, *obs)


def prefill(
  model: Policy,
  cfg: RolloutConfig,
  prompt: jax.Array,
  cache: Any,
  num: jax.Array,
  turn: jax.Array,
  at: jax.Array | None = None,
) -> tuple[jax.Array, Any]:
  """``model.hidden(prompt, cache, num, at=at)``; with ``cfg.share_prefix``
  computed once per group where that is exact: on the first turn (every
  cache then holds the same system prompt) when each group's members have
  the same prompt tokens and counts (they play one level). The group's
  first member is prefilled; its hidden states and cache are copied to
  the others. Any other turn or batch prefills every row. Both paths are
  compiled; the one taken is chosen on device."""
  if not cfg.share_prefix or model.depends_on_row:
    return model.hidden(prompt, cache, num, at=at)
  g = cfg.group_size
  tokens = prompt.reshape(-1, g, prompt.shape[1])
  counts = num.reshape(-1, g)
  same = (
    (turn == 0)
    & jnp.all(tokens == tokens[:, :1])
    & jnp.all(counts == counts[:, :1])
  )
  first = lambda x: x[::g]
  grow = lambda x: jnp.repeat(x, g, axis=0)

  def once(_):
    h, c = model.hidden(
      first(prompt),
      jax.tree.map(first, cache),
      first(num),
      at=None if at is None else first(at),
    )
    return grow(h), jax.tree.map(grow, c)

  return jax.lax.cond(
    same, once, lambda _: model.hidden(prompt, cache, num, at=at), None
  )


def decode_token(
  model: Policy,
  codec: Codec,
  cfg: RolloutConfig,
  turn: jax.Array,
  decoding: Decode,
) -> Decode:
  """Samples one token for every live sequence, records it and feeds it
  back; a sequence stops at ``</answer>``, a chat stop token or the
  context's end."""
  key, sub = jax.random.split(decoding.key)
  # A key per row, so a row samples the same tokens wherever ``decode``
  # has gathered it.
  with jax.named_scope("sample"):
    keys = jax.vmap(jax.random.fold_in, (None, 0))(sub, decoding.rows)
    tok, logp = sampling.sample(
      keys, decoding.logits, cfg.sampling, codec.allowed
    )
    dist = sampling.policy_logprobs(
      decoding.logits, cfg.temperature, codec.allowed
    )
    ent = -jnp.sum(jnp.exp(dist) * dist, axis=-1)
  pos, live = decoding.cache.length, decoding.live
  with jax.named_scope("stop"):
    stop_state, hit = codec.stop_step(decoding.stop_state, tok)
    tool_state = decoding.tool_state
    if codec.tools is not None:
      tool_state, tool_hit = codec.tool_stop_step(decoding.tool_state, tok)
      hit = hit | tool_hit
  with jax.named_scope("forward"):
    logits, cache = model(tok[:, None], decoding.cache, live.astype(jnp.int32))
  stop_ids = jnp.asarray(codec.stop_ids, jnp.int32)
  stop = hit | jnp.isin(tok, stop_ids) | (cache.length >= cfg.max_context)
  return Decode(
    step=decoding.step + 1,
    slots=decoding.slots + live.shape[0],
    logits=logits[:, 0],
    live=live & ~stop,
    stop_state=jnp.where(live, stop_state, decoding.stop_state),
    tool_state=jnp.where(live, tool_state, decoding.tool_state),
    reply=decoding.reply.at[:, decoding.step].set(jnp.where(live, tok, 0)),
    count=decoding.count + live,
    last=jnp.where(live, tok, decoding.last),
    cache=cache,
    tokens=set_at(decoding.tokens, pos, tok, live),
    loss_mask=set_at(decoding.loss_mask, pos, jnp.ones_like(live), live),
    logprobs=set_at(decoding.logprobs, pos, logp, live),
    entropy=set_at(decoding.entropy, pos, ent, live),
    turn_ids=set_at(decoding.turn_ids, pos, jnp.full_like(tok, turn), live),
    rows=decoding.rows,
    key=key,
  )


def decode(
  model: Policy,
  codec: Codec,
  cfg: RolloutConfig,
  turn: jax.Array,
  decoding: Decode,
) -> Decode:
  """Decodes until every sequence stopped or ``max_new_tokens`` (the
  loops' bound, named for ``hlo_cost``).

  With ``cfg.decode_shrinks`` the batch halves up to that many times:
  once at most half its rows are live (replies still open, of episodes
  still playing), they are gathered into a batch of half the size that
  decodes on, and scattered back when it is done. Each row samples from
  its own key, so the tokens are those of the whole batch decoding in
  lockstep; the shapes are static, so the rollout compiles once."""
  # A policy whose rows are told apart by their place cannot move rows.
  shrinks = 0 if model.depends_on_row else cfg.decode_shrinks
  with jax.named_scope("decode"):
    return _decode(model, codec, cfg, turn, decoding, shrinks)


def _decode(model, codec, cfg, turn, decoding: Decode, shrinks: int) -> Decode:
  """``decode`` on ``decoding``'s rows, halving them up to ``shrinks``
  more times."""
  size = decoding.live.shape[0]
  half = size // 2
  step = lambda decoding: decode_token(model, codec, cfg, turn, decoding)
  going = lambda decoding: (
    (decoding.step < cfg.max_new_tokens) & jnp.any(decoding.live)
  )
  if shrinks == 0 or half == 0:
    return jax.lax.while_loop(going, step, decoding)
  decoding = jax.lax.while_loop(
    lambda decoding: going(decoding) & (jnp.sum(decoding.live) > half),
    step,
    decoding,
  )

  def shrunk(decoding: Decode) -> Decode:
    # The live rows, then rows past the end (never written back).
    (at,) = jnp.nonzero(decoding.live, size=half, fill_value=size)
    take = lambda x: x[at] if x.ndim else x
    part = jax.tree.map(take, decoding).replace(
      live=decoding.live[at] & (at < size)
    )
    part = _decode(model, codec, cfg, turn, part, shrinks - 1)
    put = lambda x, y: x.at[at].set(y, mode="drop") if x.ndim else y
    return jax.tree.map(put, decoding, part)

  return jax.lax.cond(
    going(decoding), shrunk, lambda decoding: decoding, decoding
  )


def act(
  env: BatchEnv,
  cfg: RolloutConfig,
  carry: Carry,
  parsed: Parsed,
  active: jax.Array,
) -> Acting:
  """Plays a turn's parsed actions ``[B, A]`` in order while the episode
  lives, within its action budget; an environment with text answers takes
  the answer's bytes in one step.

  Returns:
    The environments after them and the actions executed.
  """
  actions = parsed.actions[:, : cfg.max_actions_per_turn]
  answer = None
  if env.spec.text_answers:
    actions = actions[:, :1]
    answer = envs.Answer(parsed.answer, parsed.answer_length)
  t = env.act(
    carry.states,
    actions,
    answer,
    active,
    carry.used,
    cfg.max_actions_per_traj,
  )
  return Acting(
    states=t.states,
    used=t.used,
    env_done=t.done,
    reward=t.reward,
    effective=t.effective,
    success=jnp.where(t.stepped, t.success, carry.success),
    terminated=jnp.where(t.stepped, t.terminated, carry.terminated),
    unavailable=t.unavailable,
    executed=t.executed,
  )


def call_tools(
  codec: Codec, decoded: Decode, active: jax.Array
) -> Results | None:
  """Runs the tool calls of the turn's replies (``envs.tools``), in one
  host call; None where the environment has no tools."""
  if codec.tools is None:
    return None
  data, count = jax.vmap(codec.to_bytes)(decoded.reply, decoded.count)
  return codec.tools(data, count, active)
