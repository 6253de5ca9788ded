"""Countdown (RAGEN's): reach the target with each given number once and
``+ - * /``; one turn, a free-text answer evaluated inside ``jit``.

  python -m starpo_jax.main --config=configs/countdown.py
  python -m starpo_jax.main \\
    --config=configs/countdown.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B-Instruct

Problems are generated inside ``jit`` (3 or 4 numbers from 1 to 99, a
target from 1 to 99 reachable by adding and subtracting them); a fixed set
is ``--config.env.kwargs.problems=FILE.jsonl``. The tiny model answers
from digits, operators and parentheses only (``rollout.answer_vocab``).
It first imitates the generator's own solutions (600 warm-start steps of
128 problems: the numbers with the signs they were drawn with, added ones
first, ``"12 + 7 - 3"``; a file's problems are solved on the host), then
learns from the reward at learning rate 1e-4: 0.1 for an expression that
uses exactly the given numbers, 1 for one that also equals the target.

``:tools=calculator`` lets the agent call a calculator before it answers
(``envs/tools.py``): up to two calls, each a turn.
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, tools="")
  c = common.base_config()
  c.env.name = "countdown"
  common.apply_presets(c, args)
  common.single_turn(c, args["algo"])
  if args["tools"]:
    # Up to two calls, each a turn, before the answer.
    c.env.kwargs.tools = args["tools"]
    c.rollout.max_turns = 3
  if args["model"] == "tiny":
    # "12 + 34 - 56 + 78" spelled digit by digit, then "</answer>".
    c.rollout.max_new_tokens = 16
    c.rollout.max_context = 64
    c.sft.steps = 600
    c.sft.episodes = 128
    c.train.steps = 100
    # RL at the from-scratch rate (1e-3) undid the warm start within 50
    # steps (37% -> 1% held-out); at 1e-4 it keeps it.
    c.optim.lr = 1e-4
    c.train.eval_every = 50
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
    if args["tools"]:
      # "<tool>calculator: 12 + 34</tool>", and three turns of context.
      c.rollout.max_context = 256
  elif args["model"] == "smollm2-135m":
    common.smollm2_on_cpu(
      c, turns=1, context=512, expert="planner", rl_steps=24
    )
  return c
