"""Question answering (RAGEN's MetaMathQA environment) over a dataset read
through tensorflow-datasets; up to two answers a question, the second worth
half.

  python -m starpo_jax.main --config=configs/qa.py
  python -m starpo_jax.main \\
    --config=configs/qa.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B \\
    --config.env.kwargs.source=/data/MetaMathQA-395K.json \\
    --config.env.kwargs.split='train[:99%]' \\
    --config.env.eval_kwargs.split='train[99%:]'

By default it trains on ``configs/data/arithmetic_qa.jsonl`` (1,000
one-step word problems in MetaMathQA's format), the first 90% for training
and the last 10% held out. Any JSONL or Parquet file with MetaMathQA's
(``query``, ``response``) or GSM8K's (``question``, ``answer``) fields
works, or a tfds dataset name (``env.kwargs.source``); tfds prepares it
once under ``env.kwargs.data_dir`` (default ``~/tensorflow_datasets``).

``:tools=calculator`` lets the agent call a calculator before it answers
(``envs/tools.py``): up to two calls, each a turn.
"""

import os

from configs import common

DATA = os.path.join(os.path.dirname(__file__), "data", "arithmetic_qa.jsonl")


def get_config(arg=None):
  args = common.parse_arg(arg, tools="")
  c = common.base_config()
  c.env.name = "qa"
  c.env.kwargs.source = DATA
  c.env.kwargs.split = "train[:90%]"
  c.env.kwargs.turns = 2
  c.env.eval_kwargs.split = "train[90%:]"
  common.apply_presets(c, args)
  c.rollout.max_turns = 2
  c.rollout.max_actions_per_turn = 1
  c.rollout.max_actions_per_traj = 2
  if args["tools"]:
    # Up to two calls, each a turn, besides the two answers.
    c.env.kwargs.tools = args["tools"]
    c.rollout.max_turns = 4
  if args["model"] == "tiny":
    # "18</answer>": a few digit tokens and the closing tag.
    c.rollout.max_new_tokens = 8
    c.rollout.max_context = 192
    c.sft.steps = 0
    c.train.steps = 100
    c.train.eval_every = 50
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
    if args["tools"]:
      # "<tool>calculator: 12 * 3</tool>", and four turns of context.
      c.rollout.max_new_tokens = 12
      c.rollout.max_context = 384
  return c
