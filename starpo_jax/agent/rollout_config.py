"""The rollout's static settings: how many episodes, of how many turns,
with how many tokens, and how the model samples (``RolloutConfig``)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from starpo_jax import settings
from starpo_jax.agent.prompt import PromptSettings
from starpo_jax.models import sampling


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Static shape and rules of a rollout (RAGEN's defaults where it has
  them)."""

  env_groups: int = 8
  group_size: int = 16
  max_turns: int = 5
  max_actions_per_turn: int = 2
  max_actions_per_traj: int = 10
  max_new_tokens: int = 100
  max_context: int = 2048
  format_penalty: float = -0.1
  enable_think: bool = True
  answer_vocab: bool = False
  prompt: Literal["ragen", "compact"] = "ragen"  # prompt_lib.PromptSettings
  observation_tokens: Literal["text", "pieces"] = "text"  # PromptSettings
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  # The batch played in this many parts one after another, each of whole
  # groups with its own KV cache: 1/chunks of the rollout's memory, the
  # same episodes (jittable environments only).
  chunks: int = 1
  # Prefill what episodes share once: the system message once for the
  # batch, and the first turn's prompt once per group (its members play
  # one level), when all of a group's first prompts are the same tokens.
  # False prefills every episode's whole prompt (what a plain loop does).
  share_prefix: bool = True
  # How many times a turn's decode batch may halve to the rows still live
  # (``turn.decode``): finished replies and finished episodes stop taking
  # decode slots. 0 decodes the whole batch in lockstep until its longest
  # reply ends.
  decode_shrinks: int = 0
  # Each layer's weights in a buffer of its own while the rollout runs
  # (``model.for_decoding()``): a second copy of the layers' weights, against
  # a copy of every layer at every decode step on XLA:CPU, where it was
  # measured. "auto": on where the rollout runs on CPUs, off on GPUs and
  # TPUs (the copy's memory, and no measured gain there). "off" slices each
  # layer out of the stacked weights at every call.
  layer_buffers: Literal["auto", "on", "off"] = "auto"
  # What a reply is sampled, scored and trained seeing (RAGEN's
  # ``context_window_mode``): "full", every turn so far; "limited", the
  # system prompt and the last ``context_turns`` turns, the current one
  # included; "single_turn", the system prompt and the current turn.
  context_window: Literal["full", "limited", "single_turn"] = "full"
  context_turns: int = 3
  # How a window hides older turns (docs/training.md, "Context windows").
  # "mask": they stay in the trajectory and the KV cache, masked from
  # attention; the visible tokens keep their places in the episode, and a
  # visible turn's cached states are those computed when it was played,
  # which saw its own window (with "limited" an older turn still reaches a
  # reply through them, as in sliding-window attention). "reprefill":
  # RAGEN's re-rendered prompt: each turn the visible turns follow the
  # system prompt at consecutive positions and are prefilled again under
  # this turn's window, and the update scores each turn as a sequence of
  # its own.
  context_method: Literal["mask", "reprefill"] = "mask"

  def __post_init__(self) -> None:
    settings.check(self, "rollout")
    for name in (
      "chunks",
      "env_groups",
      "group_size",
      "max_turns",
      "max_actions_per_turn",
      "max_actions_per_traj",
      "max_new_tokens",
      "max_context",
      "context_turns",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(
          f"rollout: {name} must be a positive integer, got {value!r}"
        )
    if self.env_groups % self.chunks:
      raise ValueError(
        f"rollout: chunks={self.chunks} must divide the {self.env_groups} "
        "groups played at once (env_groups)"
      )
    if not isinstance(self.decode_shrinks, int) or self.decode_shrinks < 0:
      raise ValueError(
        "rollout: decode_shrinks must be an integer >= 0, got "
        f"{self.decode_shrinks!r}"
      )
    if self.context_method == "reprefill" and self.context_window == "full":
      raise ValueError(
        "rollout: context_method='reprefill' re-renders a context window's "
        "visible turns; context_window='full' hides none (set it to "
        "'limited' or 'single_turn')"
      )
    self.sampling  # noqa: B018 (validates temperature, top_k, top_p)
    self.prompt_settings()  # validates the prompt style

  @property
  def batch(self) -> int:
    return self.env_groups * self.group_size

  @property
  def visible_turns(self) -> int:
    """The turns a reply sees, its own included; 0: every one
    (``context_window``)."""
    if self.context_window == "full":
      return 0
    return 1 if self.context_window == "single_turn" else self.context_turns

  @property
  def action_budget(self) -> int:
    """The most actions an episode can take: ``max_actions_per_turn`` in
    each of ``max_turns`` turns, at most ``max_actions_per_traj``."""
    per_turns = self.max_turns * self.max_actions_per_turn
    return min(self.max_actions_per_traj, per_turns)

  @property
  def max_generated(self) -> int:
    """The most tokens an episode can generate."""
    return self.max_turns * self.max_new_tokens

  @property
  def sampling(self) -> sampling.Sampling:
    return sampling.Sampling(self.temperature, self.top_k, self.top_p)

  def prompt_settings(self) -> PromptSettings:
    return PromptSettings(
      enable_think=self.enable_think,
      max_actions_per_turn=self.max_actions_per_turn,
      response_hint=self.max_new_tokens,
      answer_vocab=self.answer_vocab,
      style=self.prompt,
      observation_tokens=self.observation_tokens,
    )
