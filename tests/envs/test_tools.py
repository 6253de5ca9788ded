"""Tool calls (envs/tools.py): the call grammar against a regex, the
calculator against Python's fractions, faults, and tool turns in the
compiled rollout."""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
import time
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs import tools
from reference import tools as ref
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import rollout
from starpo_jax.algo import diagnostics
from starpo_jax.algo.experts import ScriptedPolicy
from tests.agent.test_rollout import (
  CFG,
  initial_states,
  replies_by_turn,
  script_from,
)
from tests.envs.conftest import to_numpy
from tests.helpers import assert_compiles_once
from tests.text_fixtures import TOKENIZERS

# ---------------------------------------------------------------------------
# The call grammar


FRAGMENTS = [
  "<tool>",
  "</tool>",
  "<answer>",
  "</answer>",
  "<tool",
  "tool>",
  "calculator",
  "calc ulator",
  "_x9",
  "9x",
  "é",
  ":",
  " ",
  "\n",
  "\t",
  "1 + 2",
  "(3*4)",
  "</",
  "<think>",
  "</think>",
]


@settings(max_examples=1200, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=14))
def test_call_parsing_matches_a_regex_reference(parts):
  text = "".join(parts)
  got = tools.parse_call(text)
  want = ref.call(text)
  if isinstance(got, tools.Call):
    got = (got.name, got.input)
  elif isinstance(got, str):
    got = "malformed"
  assert got == want, text


@pytest.mark.parametrize(
  "text, want",
  [
    ("<think>a</think><tool>calculator: 1 + 2</tool>", ("calculator", "1 + 2")),
    # Nested tags: the content runs to the first close.
    ("<tool><tool>calculator: 1</tool></tool>", "malformed"),
    ("<tool>calculator: <tool>1</tool>", ("calculator", "<tool>1")),
    # Several calls: the first is the call.
    (
      "<tool>calculator: 1</tool><tool>calculator: 2</tool>",
      ("calculator", "1"),
    ),
    ("<tool>calculator 1 + 2</tool>", "malformed"),  # no colon
    ("<tool>: 3</tool>", "malformed"),  # no name
    ("<tool>two words: 3</tool>", "malformed"),
    ("<tool>calculator: 1", None),  # never closed
    ("<answer>3</answer><tool>calculator: 1</tool>", None),  # answered first
    ("<answer><tool>calculator: 1</tool>", ("calculator", "1")),
  ],
)
def test_call_parsing_examples(text, want):
  got = tools.parse_call(text)
  if isinstance(got, tools.Call):
    got = (got.name, got.input)
  elif isinstance(got, str):
    got = "malformed"
  assert got == want == ref.call(text)


# ---------------------------------------------------------------------------
# The calculator

OPS = {
  "+": operator.add,
  "-": operator.sub,
  "*": operator.mul,
  "/": operator.truediv,
}


LIMIT = 10**15  # the calculator's bound on integer parts and denominators


def _checked(value: Fraction) -> Fraction | str:
  if abs(value) > LIMIT or value.denominator > LIMIT:
    return "number too large"
  return value


@st.composite
def expressions(draw, depth=3):
  """(text, its exact value or the first error met evaluating it left to
  right: "division by zero", "number too large")."""
  if depth == 0 or draw(st.booleans()):
    n = draw(st.integers(0, 999))
    return str(n), Fraction(n)
  op = draw(st.sampled_from(sorted(OPS)))
  (lt, lv), (rt, rv) = (
    draw(expressions(depth - 1)),
    draw(expressions(depth - 1)),
  )
  if isinstance(lv, str):
    value = lv
  elif isinstance(rv, str):
    value = rv
  elif op == "/" and rv == 0:
    value = "division by zero"
  else:
    value = _checked(OPS[op](lv, rv))
  text = f"({lt} {op} {rt})" if draw(st.booleans()) else f"(({lt}){op}({rt}))"
  if draw(st.booleans()):
    text, value = f"-{text}", value if isinstance(value, str) else -value
  return text, value


@settings(max_examples=600, deadline=None)
@given(expressions())
def test_calculator_matches_exact_arithmetic(expr):
  text, value = expr
  if isinstance(value, str):
    with pytest.raises(tools.ToolError, match=value):
      tools.calculate(text)
  else:
    assert tools.calculate(text) == ref.spelled(value), text


@pytest.mark.parametrize(
  "text, message",
  [
    ("__import__('os').system('true')", "only numbers"),
    ("(lambda: 1)()", "only numbers"),
    ("x + 1", "only numbers"),
    ("'a' * 3", "is not a number"),
    ("[1, 2]", "only numbers"),
    ("1 if 1 else 2", "only numbers"),
    ("2 ** 0.5", "exponents"),
    ("9 ** 9 ** 9 ** 9", "exponents|too large"),
    ("10 ** 16", "too large"),
    ("1" * 17, "too large"),
    ("1e300", "too large"),
    ("1 +", "not an arithmetic expression"),
    ("", "empty"),
    ("+".join(["1"] * 40), "parts"),
  ],
)
def test_calculator_refuses_code_and_bounds_its_numbers(text, message):
  start = time.perf_counter()
  with pytest.raises(tools.ToolError, match=message):
    tools.calculate(text)
  assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize(
  "text",
  [
    "7 % 2",
    "7 // 2",
    "2 @ 3",
    "1 << 2",
    "8 >> 1",
    "6 & 3",
    "6 | 3",
    "6 ^ 3",
    "~1",
    "not 1",
    "1 < 2",
    "1 == 1",
    "1 and 2",
  ],
)
def test_calculator_refuses_each_operator_outside_its_grammar(text):
  # Each one exactly (a random search may or may not draw it).
  with pytest.raises(tools.ToolError, match="only"):
    tools.calculate(text)


def test_calculator_bounds_hold_at_their_value_and_refuse_one_past():
  top = 10**15
  assert tools.calculate(str(top)) == str(top)
  assert tools.calculate(f"-{top}") == f"-{top}"
  with pytest.raises(tools.ToolError, match="too large"):
    tools.calculate(str(top + 1))
  assert tools.calculate(f"1 / {top}") == "0"
  with pytest.raises(tools.ToolError, match="too large"):
    tools.calculate(f"1 / {top + 1}")
  assert tools.calculate("1 ** 64") == tools.calculate("(-1) ** -64") == "1"
  with pytest.raises(tools.ToolError, match="exponents"):
    tools.calculate("1 ** 65")
  # Syntax trees of 64 and 65 nodes, as Python's ast counts them.
  at, past = "-1" + " + 1" * 20, " + ".join(["1"] * 22)
  nodes = lambda t: sum(1 for _ in ast.walk(ast.parse(t, mode="eval")))
  assert (nodes(at), nodes(past)) == (64, 65)
  assert tools.calculate(at) == "19"
  with pytest.raises(tools.ToolError, match="more than 64 parts"):
    tools.calculate(past)


def test_calculator_examples():
  assert tools.calculate("(12 + 3) * 4") == "60"
  assert tools.calculate("7 / 2") == "3.5"
  assert tools.calculate("0.1 + 0.2") == "0.3"
  assert tools.calculate("2 ** 10 - -1") == "1025"
  assert tools.calculate("1 / 3") == "0.333333"
  assert tools.calculate("-2 / 3") == "-0.666667"
  assert tools.calculate("8618515660.8 * 1") == "8618515660.8"


# ---------------------------------------------------------------------------
# Faults and the host side


def _sleepy(text: str) -> str:
  time.sleep(5)
  return text


def _broken(text: str) -> str:
  raise RuntimeError("boom")


def _wrong_type(text: str) -> str:
  return 42  # type: ignore[return-value]


for _tool in (
  tools.Tool("sleepy", "sleeps", _sleepy, timeout_s=0.2),
  tools.Tool("broken", "raises", _broken),
  tools.Tool("wrong_type", "returns a number", _wrong_type),
  tools.Tool("echo", "echoes", lambda t: t * 100, max_input=8),
):
  tools.register(_tool)


def test_faulty_tools_fail_their_call_only():
  tok = TOKENIZERS["bpe"]()
  box = tools.ToolBox.build(
    ("calculator", "sleepy", "broken", "wrong_type", "echo"), tok.encode, 128
  )
  texts = [
    "<tool>sleepy: 1</tool>",
    "<tool>broken: 1</tool>",
    "<tool>wrong_type: 1</tool>",
    "<tool>calculator: 6 * 7</tool>",
    "<tool>nope: 1</tool>",
    "<tool>echo: 123456789</tool>",  # input too long
    "<tool>echo: abcd</tool>",  # output longer than the budget
    "<answer>3</answer>",
    None,  # not playing
  ]
  start = time.perf_counter()
  out = box.run(texts)
  assert time.perf_counter() - start < 2.0  # the sleeper is not waited for
  results = [
    tok.decode(out["tokens"][i, : out["length"][i]]) for i in range(len(texts))
  ]
  assert results[:6] == [
    "<result>error: no result within 0.2 s</result>\n",
    "<result>error: RuntimeError: boom</result>\n",
    "<result>error: returned int, not text</result>\n",
    "<result>42</result>\n",
    "<result>error: no tool 'nope' (calculator, sleepy, broken, "
    "wrong_type, echo)</result>\n",
    "<result>error: input longer than 8 characters</result>\n",
  ]
  assert results[6].startswith("<result>abcdabcd")
  assert results[6].endswith("</result>\n")
  assert list(out["called"]) == [True] * 7 + [False, False]
  assert list(out["malformed"]) == [False] * 4 + [True] + [False] * 4
  assert list(out["failed"]) == [True] * 3 + [False, False, True] + [False] * 3
  assert list(out["cut"]) == [False] * 6 + [True, False, False]
  assert out["length"][6] == 128
  assert out["length"][7] == out["length"][8] == 0


def test_a_tool_input_at_its_longest_runs_and_one_longer_is_refused():
  tok = TOKENIZERS["bpe"]()
  box = tools.ToolBox.build(("echo",), tok.encode, 128)
  out = box.run(["<tool>echo: 12345678</tool>", "<tool>echo: 123456789</tool>"])
  results = [tok.decode(out["tokens"][i, : out["length"][i]]) for i in (0, 1)]
  assert results[0].startswith("<result>12345678") and not out["failed"][0]
  assert (
    results[1] == "<result>error: input longer than 8 characters</result>\n"
  )
  assert out["failed"][1]


def test_unknown_tools_and_bad_settings_are_named():
  with pytest.raises(ValueError, match="unknown tool 'abacus'"):
    envs.make("countdown", tools="calculator,abacus")
  with pytest.raises(ValueError, match="already registered"):
    tools.register(tools.Tool("calculator", "another", str))
  with pytest.raises(ValueError, match="not an ASCII identifier"):
    tools.Tool("two words", "x", str)


# ---------------------------------------------------------------------------
# Tool turns in the compiled rollout


def test_tool_turns_show_results_and_do_not_step_the_environment():
  """Scripted Countdown replies: calls (one, two, failing, malformed, of an
  unknown tool) before an answer. Decoding stops at ``</tool>``; the
  result opens the next observation; the environment is stepped by the
  answer only; a malformed call costs the format penalty; the step
  compiles once."""
  tok = TOKENIZERS["bpe"]()
  cfg = dataclasses.replace(
    CFG, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=1
  )
  env = envs.make("countdown", tools="calculator,echo")
  # Room for the error messages spelled byte by byte by the test
  # tokenizers (the default budget is 32).
  env.spec = dataclasses.replace(env.spec, tool_tokens=64)
  codec = codec_lib.Codec.build(tok, env.spec, cfg.prompt_settings())
  key = jax.random.key(5)
  states = initial_states(env, cfg, key)
  nums = [
    [int(v) for v in states.nums[b, : int(states.count[b])]]
    for b in range(cfg.batch)
  ]
  answer = lambda b: (
    "</think><answer>" + " + ".join(map(str, nums[b])) + "</answer>"
  )
  call = lambda expr: f"</think><tool>calculator: {expr}</tool>"
  script = [
    [call(f"{nums[0][0]} + {nums[0][1]}") + "ignored", answer(0)],
    [call("1 / 0"), call("6 * 7"), answer(1)],
    [answer(2)],
    ["</think><tool>calculator 1</tool>", answer(3)],
    ["</think><tool>abacus: 1</tool>", answer(4)],
    # Never answers; echo's result is longer than the budget.
    [call("2 ** 3"), "</think><tool>echo: ab</tool>", call("3")],
  ]
  # The scripted policy plays on past a stop: "ignored" becomes the
  # start of the next reply, which then still ends with its answer.
  replies = [[r for r in rows] for rows in script]
  play = jax.jit(lambda p, c, k: rollout.rollout(p, c, env, cfg, k))
  policy = ScriptedPolicy(script_from(replies, tok), tok.vocab_size)
  traj, _ = assert_compiles_once(
    play, (policy, codec, key), (policy, codec, key)
  )
  traj = to_numpy(traj)
  calls = [[1, 0], [1, 1, 0], [0], [1, 0], [1, 0], [1, 1, 1]]
  for b, row in enumerate(calls):
    assert list(traj.turn_tool[b, : len(row)]) == [bool(x) for x in row], b
    assert not traj.turn_played[b, len(row) :].any()
  assert list(traj.num_actions) == [1, 1, 1, 1, 1, 0]
  penalized = [[0, 0], [0, 0, 0], [0], [1, 0], [1, 0], [0, 0, 0]]
  for b, row in enumerate(penalized):
    assert list(traj.turn_penalized[b, : len(row)]) == [bool(x) for x in row]
  np.testing.assert_allclose(traj.turn_rewards[3, 0], cfg.format_penalty)
  seen = [tok.decode(traj.tokens[b][: int(traj.length[b])]) for b in range(6)]
  first = replies_by_turn(traj, tok, 0)
  assert first[0].endswith("</tool>") and "ignored" not in first[0]
  assert f"<result>{nums[0][0] + nums[0][1]}</result>\n" in seen[0]
  assert "<result>error: division by zero</result>" in seen[1]
  assert "<result>42</result>" in seen[1]
  assert "<result>" not in seen[2]
  assert "<result>error: not NAME: INPUT</result>" in seen[3]
  assert (
    "<result>error: no tool 'abacus' (calculator, echo)</result>" in seen[4]
  )
  assert "<result>8</result>" in seen[5]
  assert re.search("<result>(ab)+</result>", seen[5])
  assert list(traj.obs_truncated) == [0, 0, 0, 0, 0, 1]
  # The observation after a result still shows the problem.
  target = f"Target: {int(states.target[1])}"
  assert seen[1].count(target) == 3
  metrics = diagnostics.summary(traj, cfg.group_size)
  np.testing.assert_allclose(metrics["tool_calls"], 8 / 6)
  assert "calculator: (12 + 3) * 4" in tok.decode(codec.fragments.system)


def test_a_tool_needs_a_second_turn():
  from configs import countdown
  from starpo_jax.run import assembly

  c = countdown.get_config("tools=calculator")
  c.rollout.max_turns = 1
  with pytest.raises(assembly.ConfigError, match="max_turns=1 leaves no turn"):
    assembly.build(c)


def test_a_result_fits_its_token_budget_exactly_and_is_cut_one_token_past():
  # One token a character: "<result>" is 8, "</result>\n" 10.
  encode = lambda text: [ord(c) for c in text]
  repeat = tools.Tool("repeat", "repeat: 3", run=lambda s: "a" * int(s))
  box = tools.ToolBox((repeat,), encode, budget=40)
  out = box.run(["<tool>repeat: 22</tool>", "<tool>repeat: 23</tool>"])
  text = lambda i: "".join(map(chr, out["tokens"][i, : out["length"][i]]))
  assert list(out["cut"]) == [False, True]
  assert list(out["length"]) == [40, 40]
  assert text(0) == "<result>" + "a" * 22 + "</result>\n"
  assert text(1) == "<result>" + "a" * 22 + "</result>\n"
  # The least budget a result fits in: its tags and one token.
  assert tools.ToolBox.build(("calculator",), encode, 19).budget == 19
  with pytest.raises(ValueError, match="tool_tokens=18"):
    tools.ToolBox.build(("calculator",), encode, 18)


@pytest.mark.parametrize(
  "kwargs, refused",
  [
    (dict(max_input=1, timeout_s=1e-3), None),
    (dict(max_input=0), "max_input=0"),
    (dict(timeout_s=0.0), "timeout_s=0.0"),
    (dict(timeout_s=-1.0), "timeout_s=-1.0"),
  ],
)
def test_a_tools_input_cap_and_timeout_must_be_positive(kwargs, refused):
  make = lambda: tools.Tool("echo", "echoes", str, **kwargs)
  if refused is None:
    assert make().max_input == kwargs["max_input"]
    return
  with pytest.raises(ValueError, match=f"{refused} .*must be positive"):
    make()
