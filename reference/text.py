"""RAGEN's answer grammar in plain Python (regular expressions on bytes),
and its multi-turn prompt as plain strings: references for starpo_jax.text.
"""

from __future__ import annotations

import re

WHITESPACE = b" \t\n\r\x0b\x0c"
# The tags and ChatML tokens that end an answer's content.
MARKERS = (
  b"<think>",
  b"</think>",
  b"<answer>",
  b"</answer>",
  b"<|im_start|>",
  b"<|im_end|>",
  b"<|endoftext|>",
)


def parse(
  data: bytes,
  *,
  think: bool,
  markers: tuple[bytes, ...],
  max_actions: int,
  action_names: tuple[str, ...],
) -> tuple[bool, list[int]]:
  """(matched, action id per kept part, -1 for parts naming no action)."""
  content = answer(data, think=think, markers=markers)
  if content is None:
    return False, []
  parts = [p.strip(WHITESPACE) for p in content.split(b"||")]
  parts = [p for p in parts if p][:max_actions]
  lookup = {name.lower().encode(): i for i, name in enumerate(action_names)}
  return True, [lookup.get(p.lower(), -1) for p in parts]


def answer(
  data: bytes, *, think: bool, markers: tuple[bytes, ...]
) -> bytes | None:
  """The answer's text with the markers removed, or None when the grammar
  does not match."""
  pattern = (
    rb"<think>(.*?)</think>\s*<answer>(.*?)</answer>"
    if think
    else rb"<answer>(.*?)</answer>"
  )
  match = re.search(pattern, data, re.DOTALL)
  if not match:
    return None
  content = match.group(2 if think else 1)
  for marker in markers:
    content = content.replace(marker, b"")
  return content


def think_end(data: bytes) -> int | None:
  """Where the think-format grammar's ``</think>`` starts, in bytes, or
  None when it does not match."""
  match = re.search(
    rb"<think>(.*?)</think>\s*<answer>(.*?)</answer>", data, re.DOTALL
  )
  return match.end(1) if match else None


def thought(data: bytes) -> bool:
  """Whether the think-format grammar matches with a non-blank reasoning
  (RAGEN-2's valid thinking)."""
  match = re.search(
    rb"<think>(.*?)</think>\s*<answer>(.*?)</answer>", data, re.DOTALL
  )
  return bool(match and match.group(1).strip(WHITESPACE))


def format_reward(value: float) -> str:
  cents = round(value * 100)
  sign = "-" if cents < 0 else ""
  whole, frac = divmod(abs(cents), 100)
  if not frac:
    return f"{sign}{whole}"
  return f"{sign}{whole}.{frac:02d}".rstrip("0")


def turn_text(
  *,
  turn: int,
  observation: str,
  reward: float,
  warn: bool,
  actions_left: int,
  think: bool,
  hint: int,
  ended_by_stop: bool,
  compact: bool = False,
) -> str:
  """One turn's prompt text in ChatML, RAGEN's full-history layout (or,
  ``compact``, the observation alone as the user message)."""
  if compact:
    return (
      ("" if turn == 0 else "\n" if ended_by_stop else "<|im_end|>\n")
      + f"<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
      + ("<think>" if think else "<answer>")
    )
  fmt = (
    "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
    if think
    else "<answer> [your answer] </answer>"
  )
  text = ""
  if turn > 0:
    text += "\n" if ended_by_stop else "<|im_end|>\n"
  text += "<|im_start|>user\n"
  if turn > 0:
    text += f"Reward:\n{format_reward(reward)}\n"
  text += f"\nTurn {turn + 1}:\nState:\n{observation}\n"
  if warn:
    text += (
      "No valid action provided previously. Environment state remains the "
      "same. Please try again.\n"
    )
  text += (
    f"You have {actions_left} actions left. Always output: {fmt} with no "
    "extra text. Strictly follow this format. Max response length: "
    f"{hint} words (tokens).\n"
  )
  return (
    text
    + "<|im_end|>\n<|im_start|>assistant\n"
    + ("<think>" if think else "<answer>")
  )
