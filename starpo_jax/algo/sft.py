"""Supervised warm start: imitate shortest solutions, in the rollout's own
format, before reinforcement learning.

Each SFT step draws new training levels exactly as a rollout does, asks the
environment's breadth-first planner (``env.plan``) for a shortest solution
of each (or, ``expert="random_valid"``, draws random valid actions), and
lets a scripted policy spell it out as replies
(``max_actions_per_turn`` actions a turn, ``" || "`` between them, closed by
``</answer>``) while the real rollout plays them. The tokens are therefore
exactly those an RL rollout would hold for those replies, prompts and
rewards included. The policy is trained by cross-entropy on the reply
tokens, under the temperature and allowed-token mask it samples with.

In the driver the SFT steps come first (``config.sft.steps``); the RL steps
follow from the policy they leave, with a fresh optimizer state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from envs import Env, planning
from envs.host import HostEnvironment
from starpo_jax import settings, sharding
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.agent.codec import Codec
from starpo_jax.agent.parse import ANSWER_CLOSE
from starpo_jax.agent.ragged import pack
from starpo_jax.agent.rollout import RolloutConfig, Trajectory
from starpo_jax.algo.logprobs import pack_generated, sequence_logprobs
from starpo_jax.algo.state import TrainState
from starpo_jax.algo.update import apply_gradients
from starpo_jax.models.tokenizer import Tokenizer

Expert = Literal["planner", "random_valid"]


@dataclasses.dataclass(frozen=True)
class SftConfig:
  """The warm start: ``steps`` updates on ``episodes`` expert episodes of
  up to ``max_turns`` turns each.

  Measured on Sokoban with the tiny model: imitating whole five-turn
  episodes taught the answer format but nothing of the board (the action
  tokens' loss stayed at log 4 after 150 steps of 128 episodes), while
  first turns alone (``max_turns=1``, contexts a fifth as long, so each
  step is cheaper) reached 52% held-out success in 300 steps of 256,
  played as whole episodes.
  """

  steps: int = 0
  episodes: int = 256
  max_turns: int = 1
  lr: float = 1e-3
  warmup_steps: int = 0
  # "planner": shortest solutions (env.plan). "random_valid": uniformly
  # random valid actions, which teach the answer format and what is valid
  # in a state (the bandit's two offered arm names) but nothing of what is
  # good, leaving that to RL.
  expert: Expert = "planner"

  def __post_init__(self) -> None:
    settings.check(self, "sft")
    for name in ("steps", "warmup_steps"):
      if getattr(self, name) < 0:
        raise ValueError(f"sft: {name} must be >= 0")
    for name in ("episodes", "max_turns"):
      if getattr(self, name) < 1:
        raise ValueError(f"sft: {name} must be >= 1")
    if self.lr <= 0:
      raise ValueError(f"sft: lr={self.lr} must be positive")


@struct.dataclass
class ScriptCache:
  length: jax.Array  # [B] tokens held
  pos: jax.Array  # [B] script tokens emitted

  def broadcast(self, batch: int) -> ScriptCache:
    return ScriptCache(
      jnp.broadcast_to(self.length, (batch,)),
      jnp.broadcast_to(self.pos, (batch,)),
    )


@struct.dataclass
class ScriptedPolicy:
  """Row b emits ``script[b, 0], script[b, 1], ...`` whatever it is shown
  (a ``rollout.Policy``).

  Its logits put all mass on the next script token, so greedy decoding and
  sampling alike reproduce the script.
  """

  script: jax.Array  # [B, S] int32
  vocab: int = struct.field(pytree_node=False)

  def init_cache(self, batch: int, size: int) -> ScriptCache:
    del size
    zeros = jnp.zeros((batch,), jnp.int32)
    return ScriptCache(zeros, zeros)

  def _next(self, pos: jax.Array) -> jax.Array:
    rows = jnp.arange(pos.shape[0]) % self.script.shape[0]
    return self.script[rows, jnp.clip(pos, 0, self.script.shape[1] - 1)]

  def hidden(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    nxt = self._next(cache.pos).astype(jnp.float32)
    h = jnp.broadcast_to(nxt[:, None, None], (*tokens.shape, 1))
    return h, ScriptCache(cache.length + num_new, cache.pos)

  def logits(self, h):
    return 50.0 * jax.nn.one_hot(h[..., 0].astype(jnp.int32), self.vocab)

  def __call__(self, tokens, cache, num_new=None):
    if num_new is None:
      num_new = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
    pos = cache.pos + num_new
    logits = 50.0 * jax.nn.one_hot(self._next(pos), self.vocab)
    return logits[:, None], ScriptCache(cache.length + num_new, pos)


@struct.dataclass
class Replies:
  """Token spellings of replies: an action first in its turn, an action
  after ``" || "``, and the closing ``</answer>``."""

  first: jax.Array  # [A, W] int32
  first_len: jax.Array  # [A] int32
  later: jax.Array  # [A, W] int32
  later_len: jax.Array  # [A] int32
  close: jax.Array  # [C] int32

  @classmethod
  def build(cls, tokenizer: Tokenizer, action_names: tuple[str, ...]):
    if not action_names:
      raise ValueError(
        "sft: the environment takes free-text answers, and the warm start "
        "imitates action names; set sft.steps=0"
      )
    spell = lambda texts: [tokenizer.encode(t) for t in texts]
    first = spell(action_names)
    later = spell([f" || {name}" for name in action_names])
    width = max(len(ids) for ids in first + later)

    def table(rows):
      out = np.zeros((len(rows), width), np.int32)
      for i, ids in enumerate(rows):
        out[i, : len(ids)] = ids
      return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)

    (f, fl), (lt, ll) = table(first), table(later)
    close = jnp.asarray(tokenizer.encode(ANSWER_CLOSE.decode()), jnp.int32)
    return cls(first=f, first_len=fl, later=lt, later_len=ll, close=close)

  def turn_tokens(self, per_turn: int) -> int:
    """The most tokens one turn's reply takes."""
    return per_turn * self.first.shape[1] + self.close.shape[0]

  def script(self, actions: jax.Array, per_turn: int, turns: int) -> jax.Array:
    """A plan ``[H]`` (``-1`` past its end) as reply tokens, ``per_turn``
    actions a turn; turns with no action left have no reply."""
    segments = []
    for t in range(turns):
      chunk = actions[t * per_turn : (t + 1) * per_turn]
      for j in range(chunk.shape[0]):
        a = jnp.maximum(chunk[j], 0)
        ids, n = (
          (self.first, self.first_len)
          if j == 0
          else (
            self.later,
            self.later_len,
          )
        )
        keep = (jnp.arange(ids.shape[1]) < n[a]) & (chunk[j] >= 0)
        segments.append((ids[a], keep))
      close = jnp.broadcast_to(jnp.any(chunk >= 0), self.close.shape)
      segments.append((self.close, close))
    return pack(segments, turns * self.turn_tokens(per_turn))[0]


def episodes_config(
  rollout_cfg: RolloutConfig, sft_cfg: SftConfig, codec: Codec
) -> RolloutConfig:
  """How the expert episodes are played: the rollout's rules, one episode
  per level, greedy (the script decides), ``sft_cfg.max_turns`` turns in
  a context just long enough for them."""
  turns = min(sft_cfg.max_turns, rollout_cfg.max_turns)
  return dataclasses.replace(
    rollout_cfg,
    env_groups=sft_cfg.episodes,
    group_size=1,
    temperature=0.0,
    max_turns=turns,
    max_context=min(
      rollout_cfg.max_context,
      rollout_lib.context_needed(codec, rollout_cfg, turns),
    ),
  )


def check(
  env: Env, rollout_cfg: RolloutConfig, replies: Replies, expert: str
) -> None:
  """Raises ``ValueError`` naming what stops the warm start from working."""
  if isinstance(env, HostEnvironment):
    raise ValueError(
      f"sft: {env.spec.name!r} is a Python environment (envs.host); the "
      "warm start plays its experts inside the compiled step, on jittable "
      "environments only: set sft.steps=0, or warm start on a jittable "
      "environment and start from that run with train.init_from"
    )
  if expert == "planner" and not hasattr(env, "plan"):
    raise ValueError(
      f"sft: environment {env.spec.name!r} has no planner (env.plan) to "
      "imitate; sft.expert='random_valid' imitates valid play"
    )
  if rollout_cfg.enable_think:
    raise ValueError(
      "sft: imitation needs rollout.enable_think=False (the planner gives "
      "actions, not reasoning to imitate)"
    )
  actions = rollout_cfg.max_actions_per_turn
  need, budget = replies.turn_tokens(actions), rollout_cfg.max_new_tokens
  if need > budget:
    raise ValueError(
      f"sft: a reply of {actions} actions takes up to {need} tokens; "
      f"rollout.max_new_tokens={budget} is less"
    )


def expert_trajectories(
  env: Env,
  codec: Codec,
  replies: Replies,
  rollout_cfg: RolloutConfig,
  key: jax.Array,
  constrain=lambda tree: tree,
  expert: str = "planner",
) -> Trajectory:
  """Plays ``rollout_cfg.batch`` new levels with the expert's actions: their
  shortest solutions, or random valid ones."""
  states = rollout_lib.reset(env, rollout_cfg, rollout_lib.reset_key(key))
  horizon = rollout_cfg.max_actions_per_traj
  if expert == "planner":
    plans = jax.vmap(lambda s: env.plan(s, horizon))(states)
  else:
    keys = jax.random.split(jax.random.fold_in(key, 1), rollout_cfg.batch)
    plans = jax.vmap(
      lambda s, k: planning.random_valid_play(env, s, horizon, k)[0]
    )(states, keys)
  scripts = jax.vmap(
    lambda a: replies.script(
      a, rollout_cfg.max_actions_per_turn, rollout_cfg.max_turns
    )
  )(plans.actions)
  policy = ScriptedPolicy(scripts, codec.token_bytes.shape[0])
  return rollout_lib.rollout(policy, codec, env, rollout_cfg, key, constrain)


def imitation_loss(
  params: Any,
  policy_def: Any,
  traj: Trajectory,
  size: int,
  temperature: float,
  allowed: jax.Array | None,
  chunk: int,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean negative log-likelihood of the expert's reply tokens."""
  positions, mask = pack_generated(traj, size)
  model = nnx.merge(policy_def, params)
  logp, _ = sequence_logprobs(
    model, traj.tokens, positions, temperature, allowed, chunk
  )
  m = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(m), 1.0)
  loss = -jnp.sum(logp * m) / count
  return loss, {"loss": loss, "token_prob": jnp.sum(jnp.exp(logp) * m) / count}


def make_sft_step(
  *,
  env: Env,
  rollout_cfg: RolloutConfig,
  sft_cfg: SftConfig,
  policy_def: Any,
  tx: optax.GradientTransformation,
  replies: Replies,
  codec: Codec,
  logits_chunk: int,
  mesh: Any = None,
):
  """Builds ``step(state, codec) -> (state, metrics)`` (jit it), one
  supervised update of the policy on new expert episodes.

  Args:
    codec: the host's codec (its static sizes fix the context); the step
      takes the codec as an argument like the RL step.
  """
  cfg = episodes_config(rollout_cfg, sft_cfg, codec)
  check(env, cfg, replies, sft_cfg.expert)
  on_batch = sharding.batch_constraint(mesh, cfg.batch)

  def step(state: TrainState, codec: Codec):
    key = jax.random.fold_in(state.key, state.step)
    traj = expert_trajectories(
      env, codec, replies, cfg, key, on_batch, sft_cfg.expert
    )
    objective = lambda p: imitation_loss(
      p,
      policy_def,
      traj,
      cfg.max_generated,
      rollout_cfg.temperature,
      codec.allowed,
      logits_chunk,
    )
    params, opt, stats, finite = apply_gradients(
      tx,
      jax.value_and_grad(objective, has_aux=True),
      state.policy,
      state.policy_opt,
      jnp.any(traj.loss_mask),
    )
    nonfinite = jnp.where(finite, 0, state.nonfinite + 1)
    new_state = state.replace(
      step=state.step + 1, policy=params, policy_opt=opt, nonfinite=nonfinite
    )
    metrics = {f"sft/{k}": v for k, v in stats.items()}
    metrics["sft/expert_success"] = jnp.mean(traj.success)
    metrics["train/skipped_nonfinite"] = (~finite).astype(jnp.float32)
    metrics["train/nonfinite_streak"] = nonfinite.astype(jnp.float32)
    return new_state, metrics

  return sharding.traced_for(mesh, step)
