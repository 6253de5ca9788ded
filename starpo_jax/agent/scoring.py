"""The end of a turn, for the whole batch: its reward with RAGEN's format
penalty (``score``), what ends each episode, the next turn's carry
(``end_turn``), and what the turn leaves in the trajectory (``record``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from starpo_jax.agent.codec import Codec
from starpo_jax.agent.rollout_config import RolloutConfig
from starpo_jax.agent.turn import Acting, Carry, Prompted, Reply, set_at


@struct.dataclass
class TurnRecord:
  """What a turn leaves in the trajectory's per-turn arrays, ``[B]`` each
  (``actions [B, A]``)."""

  reward: jax.Array
  played: jax.Array
  response_length: jax.Array
  format_ok: jax.Array
  thought: jax.Array
  think_tokens: jax.Array
  valid: jax.Array
  effective: jax.Array
  penalized: jax.Array
  actions: jax.Array
  tool: jax.Array
  decode_steps: jax.Array  # the turn's decode iterations (the batch's)
  decode_slots: jax.Array  # the rows they decoded, an equal share each


@struct.dataclass
class Scored:
  """How a turn's reply scores, ``[B]`` each: whether it called a tool
  (well-formed or not) or answered, its valid action parts, whether the
  format penalty applies, and the turn's reward with it."""

  called: jax.Array
  malformed: jax.Array
  answered: jax.Array
  num_valid: jax.Array
  penalized: jax.Array
  reward: jax.Array


def score(
  cfg: RolloutConfig,
  active: jax.Array,
  reply: Reply,
  acting: Acting,
) -> Scored:
  """The turn's reward, with the format penalty where it applies.

  An action name the environment does not offer in this state (the
  bandit's arms are two of many names) is invalid, as in RAGEN, where each
  episode's action lookup holds only what it offers: it costs the format
  penalty rather than passing as a free no-op. A tool call is penalized
  only when malformed."""
  parsed, calls = reply.parsed, reply.calls
  no = jnp.zeros_like(active)
  called = active & (calls.called if calls else no)
  malformed = active & (calls.malformed if calls else no)
  answered = active & ~called
  num_valid = parsed.num_valid - acting.unavailable
  penalized = malformed | (
    answered & ((num_valid == 0) | (num_valid < parsed.num_parts))
  )
  reward = acting.reward + jnp.where(penalized, cfg.format_penalty, 0.0)
  return Scored(called, malformed, answered, num_valid, penalized, reward)


def end_turn(
  codec: Codec,
  cfg: RolloutConfig,
  carry: Carry,
  prompted: Prompted,
  reply: Reply,
  acting: Acting,
  turn: jax.Array,
) -> tuple[Carry, TurnRecord]:
  """The turn's reward (with the format penalty) on its last token, what
  ends the episode, and the turn's record."""
  active, decoded, calls = prompted.active, reply.decoded, reply.calls
  s = score(cfg, active, reply, acting)
  last = decoded.cache.length - 1
  rewards = set_at(carry.rewards, last, s.reward, active & (decoded.count > 0))
  out_of_budget = acting.used >= cfg.max_actions_per_traj
  ended = active & (
    acting.env_done | out_of_budget | (turn == cfg.max_turns - 1)
  )
  # A tool's result is shown by the next turn only.
  if calls is None:
    result, result_length, cut = carry.result, carry.result_length, 0
  else:
    result = calls.tokens
    result_length = jnp.where(s.called, calls.length, 0)
    cut = s.called & calls.cut
  after = Carry(
    states=acting.states,
    cache=decoded.cache,
    tokens=decoded.tokens,
    loss_mask=decoded.loss_mask,
    turn_ids=decoded.turn_ids,
    logprobs=decoded.logprobs,
    entropy=decoded.entropy,
    rewards=rewards,
    done=carry.done | ended | ~prompted.fits,
    used=acting.used,
    last_reward=jnp.where(active, s.reward, carry.last_reward),
    warn=s.answered & (s.num_valid == 0),
    ended_by_stop=decoded.last == codec.chat_stop,
    terminated=acting.terminated,
    success=acting.success,
    context_truncated=prompted.context_truncated,
    result=result,
    result_length=result_length,
    results_cut=carry.results_cut + cut,
    turn_start=carry.turn_start.at[:, turn].set(carry.cache.length),
    key=decoded.key,
  )
  return after, record(active, reply, acting, s)


def record(
  active: jax.Array,
  reply: Reply,
  acting: Acting,
  scored: Scored,
) -> TurnRecord:
  """What the turn leaves in the trajectory's per-turn arrays."""
  decoded, parsed = reply.decoded, reply.parsed
  matched = scored.answered & parsed.matched
  return TurnRecord(
    reward=jnp.where(active, scored.reward, 0.0),
    played=active,
    response_length=jnp.where(active, decoded.count, 0),
    format_ok=matched | (scored.called & ~scored.malformed),
    thought=active & parsed.thought,
    think_tokens=jnp.where(matched, parsed.think_tokens, 0),
    valid=scored.answered
    & (scored.num_valid > 0)
    & (scored.num_valid == parsed.num_parts),
    effective=active & acting.effective,
    penalized=scored.penalized,
    actions=acting.executed.T,
    tool=scored.called,
    decode_steps=jnp.full_like(decoded.count, decoded.step),
    decode_slots=jnp.full(
      decoded.count.shape, decoded.slots / decoded.count.shape[0]
    ),
  )
