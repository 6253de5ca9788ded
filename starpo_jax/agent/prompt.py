"""RAGEN's multi-turn prompt, as text and as pre-tokenized fragments: the
system message (instructions, symbols, the answer format), each turn's
head (reward, turn number, state, actions left, the format reminder) and
the reply's opening tag. ``PromptSettings`` chooses RAGEN's wording or a
compact one, think mode, and how observations become tokens; the codec
(``codec.py``) assembles a turn's tokens from these fragments inside
``jit``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs import EnvSpec
from envs import tools as tools_lib
from starpo_jax.models.tokenizer import Tokenizer

FORMAT_THINK = (
  "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
)


FORMAT_NO_THINK = "<answer> [your answer] </answer>"


WARNING = (
  "No valid action provided previously. Environment state remains the same. "
  "Please try again.\n"
)


# A reward in a prompt: sign, up to six integer digits, point, two decimals.
REWARD_DIGITS = 6


REWARD_TOKENS = 1 + REWARD_DIGITS + 1 + 2


PROMPT_STYLES = ("ragen", "compact")


OBSERVATION_TOKENS = ("text", "pieces")


@dataclasses.dataclass(frozen=True)
class PromptSettings:
  """What the prompt says and how answers are read.

  ``max_actions_per_turn`` is the ``N`` of "You can make up to N actions"
  (choice made here: RAGEN prints the per-episode budget there, though only
  ``max_actions_per_turn`` actions of an answer are executed).
  ``response_hint`` is the length promised in the format reminder.

  ``style="ragen"`` is RAGEN's prompt: instructions, legend and actions in
  the system message; per turn the previous reward, ``Turn k:``, the state,
  the actions left and the format reminder. ``style="compact"`` is for
  models trained from scratch, which read none of that text: the system
  message names the environment and each user message is the observation
  alone. Contexts are about half as long (the update's cost), and the
  tokens between an observation and the reply are the same every turn, so
  each board cell sits at a fixed distance from the answer.
  """

  enable_think: bool = True
  max_actions_per_turn: int = 2
  response_hint: int = 100
  # Restrict generation to the tokens answers are made of (action names,
  # separators, tags, whitespace, end of turn). Off for pretrained models;
  # on for a model learning from scratch, which could otherwise not stumble
  # on a well-formed answer by chance.
  answer_vocab: bool = False
  style: str = "ragen"
  # How a jittable environment's observation becomes tokens. "text": the
  # whole text through the tokenizer, as a serving engine would (one host
  # call a turn), where the tokenizer merges bytes: a pretrained BPE joins
  # "######" into "####" + "##". "pieces": each piece's tokens, joined in
  # the graph (no host call; the same text, other token ids). The compact
  # tokenizer is made of the pieces: its observations are always pieces.
  observation_tokens: str = "text"

  def __post_init__(self) -> None:
    if self.style not in PROMPT_STYLES:
      raise ValueError(
        f"prompt: style={self.style!r}; expected one of {PROMPT_STYLES}"
      )
    if self.observation_tokens not in OBSERVATION_TOKENS:
      raise ValueError(
        f"prompt: observation_tokens={self.observation_tokens!r}; expected "
        f"one of {OBSERVATION_TOKENS}"
      )

  @property
  def compact(self) -> bool:
    return self.style == "compact"


def system_text(spec: EnvSpec, settings: PromptSettings) -> str:
  """The system message: instructions, symbol legend, actions (or, in the
  compact style, the environment's name)."""
  if settings.compact:
    return spec.name
  text = "You're a helpful assistant. " + spec.instructions
  if spec.legend:
    text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
      f"{symbol}: {meaning}" for symbol, meaning in spec.legend
    )
  if spec.list_actions:
    text += "\nYour available actions are:\n" + ", ".join(spec.action_names)
    text += (
      f"\nYou can make up to {settings.max_actions_per_turn} actions, "
      'separated by the action separator " || "\n'
    )
  if spec.tools:
    text += (
      "\nBefore you answer you may call a tool instead; its result comes "
      "back in the next turn. "
      + "; ".join(tools_lib.TOOLS[n].description for n in spec.tools)
      + "."
    )
  return text


def prompt_pieces(spec: EnvSpec, settings: PromptSettings) -> list[str]:
  """Every text the prompts are built from, for a compact vocabulary."""
  fmt = FORMAT_THINK if settings.enable_think else FORMAT_NO_THINK
  return [
    *spec.pieces,
    # What answers are made of: each action one token, unless the
    # environment names the parts its names are spelled from.
    *spec.answer_pieces,
    *_name_pieces(spec),
    "||",
    " || ",
    system_text(spec, settings),
    "Reward:\n",
    "\nTurn ",
    ":\nState:\n",
    WARNING,
    "You have ",
    _reminder(fmt),
    " words (tokens).\n",
    "system",
    "user",
    "assistant",
    *tool_pieces(spec),
  ]


def _name_pieces(spec: EnvSpec) -> list[str]:
  """The action names as compact-vocabulary pieces, alone and after a
  space; none when ``spec.answer_pieces`` spell them."""
  if spec.answer_pieces:
    return []
  return [*spec.action_names, *(f" {name}" for name in spec.action_names)]


def tool_pieces(spec: EnvSpec) -> list[str]:
  """What tool calls and results are made of (none without tools)."""
  if not spec.tools:
    return []
  return [
    tools_lib.TOOL_OPEN,
    tools_lib.TOOL_CLOSE,
    tools_lib.RESULT_OPEN,
    tools_lib.RESULT_CLOSE + "\n",
    "error: ",
    *(f"{n}: " for n in spec.tools),
    *(p for n in spec.tools for p in tools_lib.TOOLS[n].pieces),
  ]


def _reminder(fmt: str) -> str:
  return (
    f" actions left. Always output: {fmt} with no extra text. Strictly "
    "follow this format. Max response length: "
  )


def format_reward(value: float) -> str:
  """Rewards in prompts: rounded to 0.01, no trailing zeros (``-0.1``,
  ``10.9``, ``1``). RAGEN prints Python floats, float noise included."""
  cents = round(value * 100)
  sign = "-" if cents < 0 else ""
  whole, frac = divmod(abs(cents), 100)
  text = f"{sign}{whole}"
  if frac:
    text += f".{frac:02d}".rstrip("0")
  return text


@dataclasses.dataclass(frozen=True)
class Fragments:
  """Pre-tokenized prompt fragments (static, hashable)."""

  system: tuple[int, ...]  # begin + the whole system message
  user_start: tuple[int, ...]
  reward_head: tuple[int, ...]  # "Reward:\n"
  newline: tuple[int, ...]
  turn_head: tuple[int, ...]  # "\nTurn "
  state_head: tuple[int, ...]  # ":\nState:\n"
  warning: tuple[int, ...]
  actions_head: tuple[int, ...]  # "You have "
  reminder: tuple[int, ...]  # " actions left. Always output: ... length: "
  reminder_tail: tuple[int, ...]  # " words (tokens).\n"
  reply_start: tuple[int, ...]  # message end + assistant start + tag
  end_after_stop: tuple[int, ...]  # what closes a reply that emitted stop
  end_full: tuple[int, ...]  # what closes a reply that did not
  digits: tuple[int, ...]  # token of "0".."9"
  minus: int
  dot: int


def fragments(
  tokenizer: Tokenizer, spec: EnvSpec, settings: PromptSettings
) -> Fragments:
  """The prompt's constant pieces, tokenized; numbers are spelled digit by
  digit, so each digit, the minus and the point must be one token."""
  chat = tokenizer.chat
  enc = lambda text: tuple(tokenizer.encode(text))
  single = {}
  for ch in "0123456789-.":
    ids = tokenizer.encode(ch)
    if len(ids) != 1:
      raise ValueError(f"codec: the tokenizer spells {ch!r} as {ids}")
    single[ch] = ids[0]
  tag = "<think>" if settings.enable_think else "<answer>"
  fmt = FORMAT_THINK if settings.enable_think else FORMAT_NO_THINK
  after_stop = chat.message_end[len(chat.stop) :]
  return Fragments(
    system=enc(
      chat.begin
      + chat.start("system")
      + system_text(spec, settings)
      + chat.message_end
    ),
    user_start=enc(chat.start("user")),
    reward_head=enc("Reward:\n"),
    newline=enc("\n"),
    turn_head=enc("\nTurn "),
    state_head=enc(":\nState:\n"),
    warning=enc(WARNING),
    actions_head=enc("You have "),
    reminder=enc(_reminder(fmt)),
    reminder_tail=enc(" words (tokens).\n"),
    reply_start=enc(chat.message_end + chat.start("assistant") + tag),
    end_after_stop=enc(after_stop),
    end_full=enc(chat.message_end),
    digits=tuple(single[str(d)] for d in range(10)),
    minus=single["-"],
    dot=single["."],
  )


def answer_tokens(
  tokenizer: Tokenizer, spec: EnvSpec, settings: PromptSettings, vocab: int
) -> np.ndarray:
  """``[vocab]`` bool: the tokens answers are made of (action names or the
  answer's alphabet, separators, tags, whitespace, end of turn)."""
  words = [
    *spec.answer_pieces,
    *spec.action_names,
    *(f" {n}" for n in spec.action_names),
    "||",
    " || ",
    " ",
    "\n",
    "</answer>",
    tokenizer.chat.stop,
  ]
  if settings.enable_think:
    words += ["</think>", "<answer>"]
  words += tool_pieces(spec)
  mask = np.zeros(vocab, bool)
  for w in words:
    mask[tokenizer.encode(w)] = True
  mask[list(tokenizer.stop_ids)] = True
  return mask
