"""The two-armed bandit with risk-hinting arm names (RAGEN's Bandit).

  python -m starpo_jax.main --config=configs/bandit.py
  python -m starpo_jax.main \\
    --config=configs/bandit.py:model=qwen2.5-0.5b,ckpt=/models/Qwen2.5-0.5B-Instruct

Training draws arm names from the train list; validation uses the disjoint
test list (``env.eval_kwargs.split``), so it measures whether the policy
learned what the names mean. A model trained from scratch has never seen
the held-out names (their embeddings never train), so only a pretrained
checkpoint can generalise there; the tiny model's validation also reports
the training names on held-out seeds.
"""

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg)
  c = common.base_config()
  c.env.name = "bandit"
  c.env.eval_kwargs.split = "test"
  common.apply_presets(c, args)
  common.single_turn(c, args["algo"])
  if args["model"] == "tiny":
    c.rollout.max_new_tokens = 4
    c.rollout.max_context = 192
    # Warm start on random valid pulls: it teaches answering with one of
    # the two offered names, not which one.
    c.sft.steps = 60
    c.sft.episodes = 64
    c.sft.expert = "random_valid"
    # RL learns which name is the risky one.
    c.train.steps = 60
    c.optim.lr = 3e-4
    c.rollout.env_groups = 16
    c.rollout.group_size = 8
    # Evaluate untrained, where RL starts and at the end.
    c.train.eval_every = c.sft.steps + c.train.steps
  elif args["model"] == "smollm2-135m":
    common.smollm2_on_cpu(
      c, turns=1, context=512, expert="random_valid", rl_steps=24
    )
  return c
