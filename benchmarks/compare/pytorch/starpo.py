"""StarPO in PyTorch, the way RAGEN runs it: Python environments stepped
between turns, ``transformers`` generation, then the clipped policy update.

It plays the same workload as the JAX step: the same weights (exported with
``starpo_jax.models.hf.save``), tokenizer, prompts, answer grammar, rewards
and loss, so that a throughput ratio compares equal work. The episode logic
uses the plain-Python references the JAX code is tested against
(``reference/envs.py``, ``reference/text.py``).

Two generation loops:

* ``Generator("dynamic")``: ``model.generate`` with its default dynamic
  cache, one call per turn on the episodes still playing, re-reading each
  episode's whole history (RAGEN with a Hugging Face rollout).
* ``Generator("static")``: the fastest loop we could write: every episode
  keeps one preallocated ``StaticCache`` for the whole episode, each turn
  only prefills the new prompt, and one-token decoding runs through
  ``torch.compile`` when ``compile=True``.

The update matches ``starpo_jax.step``: GRPO advantages (no critic, no
KL), shuffled minibatches, log-probabilities formed only at generated
positions, token-mean clipped loss with clip-higher and dual clip, an
entropy bonus, global-norm clipping and AdamW.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import numpy as np
import torch

from benchmarks.compare.pytorch.config import Clock, Config, token_logprobs
from benchmarks.compare.pytorch.generator import Generator
from reference import envs as ref
from reference import text as reference_text
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.models.tokenizer import Tokenizer


def sequence_logprobs(
  model: Any,
  tokens: torch.Tensor,
  attention_mask: torch.Tensor,
  positions: torch.Tensor,
  temperature: float,
  allowed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
  """Log-probabilities and entropies ``[B, G]`` of the tokens at
  ``positions [B, G]``; logits are formed only there."""
  hidden = model.model(
    input_ids=tokens, attention_mask=attention_mask
  ).last_hidden_state
  before = (positions - 1).clamp(min=0)
  h = hidden.gather(1, before[..., None].expand(-1, -1, hidden.shape[-1]))
  targets = tokens.gather(1, positions)
  return token_logprobs(model.lm_head(h), targets, temperature, allowed)


def policy_loss(
  logp: torch.Tensor,
  old_logp: torch.Tensor,
  adv: torch.Tensor,
  mask: torch.Tensor,
  clip_low: float,
  clip_high: float,
  dual_clip: float,
) -> torch.Tensor:
  """Token-mean clipped surrogate, asymmetric clip, dual clip (verl's)."""
  ratio = torch.exp(logp - old_logp)
  loss1 = -adv * ratio
  loss2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
  clipped = torch.maximum(loss1, loss2)
  dual = torch.minimum(-adv * dual_clip, clipped)
  per_token = torch.where(adv < 0, dual, clipped)
  m = mask.to(per_token.dtype)
  return (per_token * m).sum() / m.sum().clamp(min=1.0)


def grpo_advantages(scores: torch.Tensor, groups: int) -> torch.Tensor:
  """Per-episode GRPO advantages: (score - group mean) / (std + 1e-6)."""
  g = scores.reshape(groups, -1)
  if g.shape[1] == 1:
    return scores.clone()
  # Differences to the first score first: a group of equal scores gets
  # exactly 0, not rounding noise divided by 1e-6.
  d = g - g[:, :1]
  centered = d - d.mean(1, keepdim=True)
  std = centered.square().sum(1, keepdim=True).div(g.shape[1] - 1).sqrt()
  return (centered / (std + 1e-6)).reshape(-1)


# ----------------------------------------------------------------------------
# Rollout.


@dataclasses.dataclass
class Episode:
  env: Any
  ids: list[int]
  mask: list[bool]
  logp: list[float]
  used: int = 0
  reward: float = 0.0
  warn: bool = False
  ended_by_stop: bool = False
  done: bool = False
  ret: float = 0.0


@dataclasses.dataclass
class Rollout:
  episodes: list[Episode]
  generated_tokens: int

  def batch(self) -> dict[str, torch.Tensor]:
    """Right-padded ``tokens``, ``attention_mask``, ``positions`` of the
    generated tokens (packed to the front), their ``old_logp`` and
    ``mask``, and each episode's ``score``."""
    b = len(self.episodes)
    length = max(len(e.ids) for e in self.episodes)
    gen = max(1, max(sum(e.mask) for e in self.episodes))
    tokens = torch.zeros(b, length, dtype=torch.long)
    attention = torch.zeros(b, length, dtype=torch.long)
    positions = torch.zeros(b, gen, dtype=torch.long)
    old_logp = torch.zeros(b, gen)
    mask = torch.zeros(b, gen, dtype=torch.bool)
    for i, e in enumerate(self.episodes):
      tokens[i, : len(e.ids)] = torch.tensor(e.ids)
      attention[i, : len(e.ids)] = 1
      where = [p for p, m in enumerate(e.mask) if m]
      positions[i, : len(where)] = torch.tensor(where, dtype=torch.long)
      old_logp[i, : len(where)] = torch.tensor(
        [e.logp[p] for p in where], dtype=torch.float32
      )
      mask[i, : len(where)] = True
    scores = torch.tensor([e.ret for e in self.episodes], dtype=torch.float32)
    return dict(
      tokens=tokens,
      attention_mask=attention,
      positions=positions,
      old_logp=old_logp,
      mask=mask,
      score=scores,
    )

  def success_rate(self) -> float:
    return float(np.mean([e.env.solved() for e in self.episodes]))


def sokoban_levels(count: int, rng: random.Random) -> list[ref.Sokoban]:
  """New 6x6 one-box levels from gym-sokoban's generator (RAGEN's)."""
  from gym_sokoban.envs import room_utils

  # gym-sokoban draws from both global generators.
  seed = rng.randrange(1 << 31)
  np.random.seed(seed)
  random.seed(seed)
  out = []
  while len(out) < count:
    try:
      fixed, state, _ = room_utils.generate_room(
        dim=(6, 6), num_steps=int(1.7 * 12), num_boxes=1
      )
    except (RuntimeError, RuntimeWarning):
      continue
    cells = lambda m: {tuple(map(int, rc)) for rc in np.argwhere(m)}
    out.append(
      ref.Sokoban(
        walls=cells(fixed == 0),
        targets=cells(fixed == 2),
        boxes=cells((state == 3) | (state == 4)),
        player=tuple(map(int, np.argwhere(state == 5)[0])),
        rows=6,
        cols=6,
        max_steps=100,
      )
    )
  return out


def turn_budget(tok: Tokenizer, cfg: Config, observation: str) -> int:
  """Most tokens one turn's prompt and reply can take."""
  prompt = reference_text.turn_text(
    turn=cfg.max_turns - 1,
    observation=observation,
    reward=-10.55,
    warn=True,
    actions_left=cfg.max_actions_per_traj,
    think=cfg.enable_think,
    hint=cfg.max_new_tokens,
    ended_by_stop=False,
  )
  return len(tok.encode(prompt)) + cfg.max_new_tokens + 1


def rollout(
  policy: Generator,
  system: list[int],
  levels: list[Any],
  gen: torch.Generator,
) -> Rollout:
  """Plays every level to the end: ``max_turns`` turns at most."""
  cfg, tok, clock = policy.cfg, policy.tok, policy.clock
  eps = [
    Episode(lv, list(system), [False] * len(system), [0.0] * len(system))
    for lv in levels
  ]
  budget = len(system) + cfg.max_turns * turn_budget(
    tok, cfg, levels[0].text("grid")
  )
  policy.start(len(eps), budget)
  generated = 0
  for turn in range(cfg.max_turns):
    rows = [i for i, e in enumerate(eps) if not e.done]
    if not rows:
      break
    prompts = []
    with clock("render prompt"):
      for i in rows:
        chunk = _prompt_chunk(eps[i], turn, cfg, tok)
        # What the cache has not seen: the system prompt, too, at first.
        prompts.append((system if turn == 0 else []) + chunk)
    responses, logps = policy(rows, [eps[i].ids for i in rows], prompts, gen)
    for i, resp, lp in zip(rows, responses, logps, strict=True):
      generated += len(resp)
      _play_reply(eps[i], resp, lp, turn, cfg, tok, clock)
  return Rollout(eps, generated)


def _prompt_chunk(e: Episode, turn: int, cfg: Config, tok: Tokenizer):
  """The turn's prompt tokens, appended to the episode (not trained)."""
  chunk = tok.encode(
    reference_text.turn_text(
      turn=turn,
      observation=e.env.text("grid"),
      reward=e.reward,
      warn=e.warn,
      actions_left=cfg.max_actions_per_traj - e.used,
      think=cfg.enable_think,
      hint=cfg.max_new_tokens,
      ended_by_stop=e.ended_by_stop,
    )
  )
  e.ids += chunk
  e.mask += [False] * len(chunk)
  e.logp += [0.0] * len(chunk)
  return chunk


def _play_reply(
  e: Episode, resp, lp, turn: int, cfg: Config, tok, clock: Clock
) -> None:
  """The reply appended to the episode (trained), its answer parsed and
  played in the episode's environment."""
  e.ids += resp
  e.mask += [True] * len(resp)
  e.logp += lp
  e.ended_by_stop = bool(resp) and resp[-1] == tok.token_to_id(tok.chat.stop)
  with clock("parse"):
    # Ids past the tokenizer (a padded embedding) stand for no bytes.
    open_tag = b"<think>" if cfg.enable_think else b"<answer>"
    data = open_tag + b"".join(
      tok.token_bytes(t) for t in resp if t < tok.vocab_size
    )
    _, actions = reference_text.parse(
      data,
      think=cfg.enable_think,
      markers=reference_text.MARKERS,
      max_actions=cfg.max_actions_per_turn,
      action_names=("Up", "Down", "Left", "Right"),
    )
  with clock("environment"):
    reward, e.warn, env_done, e.used = ref.play_answer(
      e.env, actions, e.used, cfg.max_actions_per_traj, cfg.format_penalty
    )
  e.reward, e.ret = reward, e.ret + reward
  e.done = (
    env_done or e.used >= cfg.max_actions_per_traj or turn == cfg.max_turns - 1
  )


# ----------------------------------------------------------------------------
# Update and the whole iteration.


def model_device(model: Any) -> torch.device:
  """Where ``model``'s parameters (and so its inputs) live."""
  return next(model.parameters()).device


def optimizer(model: Any, cfg: Config) -> torch.optim.Optimizer:
  return torch.optim.AdamW(
    model.parameters(),
    lr=cfg.lr,
    betas=(cfg.b1, cfg.b2),
    eps=1e-8,
    weight_decay=cfg.weight_decay,
  )


def minibatch_step(
  model: Any,
  opt: torch.optim.Optimizer,
  pick: dict[str, torch.Tensor],
  cfg: Config,
  allowed: torch.Tensor | None,
) -> float:
  """One optimizer step on a minibatch; returns its loss."""
  # Trim the minibatch to its own longest episode.
  length = int(pick["attention_mask"].sum(1).max())
  logp, ent = sequence_logprobs(
    model,
    pick["tokens"][:, :length],
    pick["attention_mask"][:, :length],
    pick["positions"],
    cfg.temperature,
    allowed,
  )
  m = pick["mask"]
  loss = policy_loss(
    logp,
    pick["old_logp"],
    pick["adv"],
    m,
    cfg.clip_low,
    cfg.clip_high,
    cfg.dual_clip,
  )
  mf = m.float()
  entropy = (ent * mf).sum() / mf.sum().clamp(min=1.0)
  loss = loss - cfg.entropy_coef * entropy
  opt.zero_grad(set_to_none=True)
  loss.backward()
  torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
  opt.step()
  return float(loss.detach())


def keep_groups(
  batch: dict[str, torch.Tensor], cfg: Config
) -> tuple[dict[str, torch.Tensor], int]:
  """The episodes of the groups StarPO-S keeps (the top ``keep_fraction``
  by in-group reward std, ties to the earlier group), and how many."""
  if cfg.keep_fraction >= 1:
    return batch, cfg.env_groups
  k = min(max(int(cfg.keep_fraction * cfg.env_groups), 1), cfg.env_groups)
  scores = batch["score"].reshape(cfg.env_groups, -1)
  std = scores.std(1) if scores.shape[1] > 1 else torch.zeros(len(scores))
  kept = torch.sort(torch.argsort(-std, stable=True)[:k]).values
  rows = kept[:, None] * cfg.group_size + torch.arange(cfg.group_size)
  rows = rows.reshape(-1)
  return {name: v[rows] for name, v in batch.items()}, k


def update(
  model: Any,
  opt: torch.optim.Optimizer,
  batch: dict[str, torch.Tensor],
  cfg: Config,
  allowed: torch.Tensor | None,
  gen: torch.Generator,
  clock: Clock | None = None,
) -> dict[str, float]:
  """One epoch of shuffled minibatches of the clipped policy update, on
  the kept groups only (RAGEN slices them out): minibatches keep their
  size (``batch / minibatches`` episodes), so fewer of them run. ``clock``
  times its parts."""
  clock = clock or Clock(model_device(model))
  with clock("select"):
    batch, groups = keep_groups(batch, cfg)
  with clock("advantages"):
    adv = grpo_advantages(batch["score"], groups)[:, None] * batch["mask"]
  with clock("update"):
    b = adv.shape[0]
    order = torch.randperm(b, generator=gen)
    mb = cfg.batch // cfg.minibatches
    losses = []
    for k in range(-(-b // mb)):
      idx = order[k * mb : (k + 1) * mb]
      pick = {name: v[idx] for name, v in batch.items()}
      pick["adv"] = adv[idx]
      pick = {name: v.to(model_device(model)) for name, v in pick.items()}
      losses.append(minibatch_step(model, opt, pick, cfg, allowed))
  return {"loss": float(np.mean(losses))}


class Loop:
  """The whole StarPO iteration in PyTorch: new levels, rollout, update."""

  def __init__(
    self,
    model: Any,
    tok: Tokenizer,
    spec: Any,
    cfg: Config,
    allowed: np.ndarray | None,
    kind: str = "dynamic",
    compile: bool = False,
    seed: int = 0,
  ):
    settings = prompt_lib.PromptSettings(
      enable_think=cfg.enable_think,
      max_actions_per_turn=cfg.max_actions_per_turn,
      response_hint=cfg.max_new_tokens,
      answer_vocab=allowed is not None,
    )
    chat = tok.chat
    self.system = tok.encode(
      chat.begin
      + chat.start("system")
      + prompt_lib.system_text(spec, settings)
      + chat.message_end
    )
    self.model, self.cfg = model, cfg
    self.allowed = (
      None
      if allowed is None
      else torch.as_tensor(allowed).to(model_device(model))
    )
    # The seconds of each part of the loop, summed over its iterations.
    self.clock = Clock(model_device(model))
    self.generator = Generator(
      model, tok, cfg, self.allowed, kind, compile, self.clock
    )
    self.opt = optimizer(model, cfg)
    self.rng = random.Random(seed)
    self.gen = torch.Generator().manual_seed(seed)

  def levels(self) -> list[ref.Sokoban]:
    """``env_groups`` new levels, each played by ``group_size`` episodes."""
    out = []
    for lv in sokoban_levels(self.cfg.env_groups, self.rng):
      out += [copy.deepcopy(lv) for _ in range(self.cfg.group_size)]
    return out

  def rollout(self) -> Rollout:
    self.model.eval()
    with self.clock("new levels"):
      levels = self.levels()
    return rollout(self.generator, self.system, levels, self.gen)

  def iteration(self) -> dict[str, float]:
    with self.clock("collect"):
      played = self.rollout()
    self.model.train()
    with self.clock("batch"):
      batch = played.batch()
    stats = update(
      self.model, self.opt, batch, self.cfg, self.allowed, self.gen, self.clock
    )
    return dict(
      stats,
      generated_tokens=played.generated_tokens,
      success=played.success_rate(),
    )
