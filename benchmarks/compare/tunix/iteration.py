"""Tunix's side of the side-by-side iteration, run in Tunix's own
environment: the iteration workload (Sokoban, GRPO, the tiny Qwen2 policy)
trained by Tunix's agentic GRPO learner as its FrozenLake example drives
it: a Tunix multi-turn environment (``BaseTaskEnv``) and conversation
agent (``ConversationAgentBase``), a dataset with one entry per level,
``RLCluster`` on one mesh with the vanilla (Tunix sampler) rollout, and
``GRPOLearner.train``.

  .venv/bin/python benchmarks/compare/tunix/iteration.py SPEC.json OUT.json

``SPEC.json`` (written by ``benchmarks.compare.tunix.side_by_side``) holds the
checkpoint and tokenizer directories, the system prompt, the rollout and
update settings and the levels; ``OUT.json`` gets the wall time of every
iteration (the interval between two of Tunix's requests for a batch of
levels) and the tokens each generated. The episode rules are the
plain-Python ones of ``reference/`` (the rules the JAX environments are
tested against); nothing here imports starpo_jax (this environment does
not have it).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from typing import Any

import jax
import numpy as np
import optax
import transformers
from tunix.models.qwen2 import params as qwen2_params
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic.agents import agent_types, base_agent
from tunix.rl.agentic.environments import base_environment
from tunix.rl.agentic.parser.chat_template_parser import parser
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
sys.path.insert(0, ROOT)
from logits import model_config  # noqa: E402  (this script's directory)

from reference import envs as ref  # noqa: E402
from reference import text as ref_text  # noqa: E402

ACTIONS = ("Up", "Down", "Left", "Right")
# The workload's settings, set from SPEC.json before the learner starts
# (Tunix builds agents and environments from their classes).
SPEC: dict[str, Any] = {}
# When each model reply came back (perf_counter), to count turns.
REPLIES: list[float] = []
# (name, value, step, perf_counter) of every scalar Tunix logs.
EVENTS: list[tuple[str, float, int | None, float]] = []


def user_text(**turn: Any) -> str:
  """One turn's user message of RAGEN's prompt (``reference.text``), the
  content alone: Tunix's chat parser adds the role markers."""
  chatml = ref_text.turn_text(think=False, ended_by_stop=True, **turn)
  return chatml.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


class SokobanEnv(base_environment.BaseTaskEnv):
  """A Sokoban level under RAGEN's rules (``reference.envs.Sokoban``): an
  answer's actions (``||``-separated, at most ``max_actions_per_turn``)
  are stepped in order, the episode ends when solved, out of actions or
  turns; an answer with no valid action costs the format penalty."""

  def __init__(self, entry: dict[str, Any], **kwargs: Any):
    level = json.loads(str(np.asarray(entry["level"]).reshape(-1)[0]))
    self.level = level
    super().__init__(task=dict(level=level), max_steps=SPEC["max_turns"])
    # Tunix groups episodes by these (group_id, pair_index).
    self.extra_kwargs = dict(kwargs)

  def _initial_observation(self) -> Any:
    lv = self.level
    self.env = ref.Sokoban(
      walls={tuple(c) for c in lv["walls"]},
      targets={tuple(c) for c in lv["targets"]},
      boxes={tuple(c) for c in lv["boxes"]},
      player=tuple(lv["player"]),
      rows=lv["rows"],
      cols=lv["cols"],
      max_steps=lv["max_steps"],
    )
    self.used = 0
    return dict(
      observation=self.env.text("grid"), reward=0.0, warn=False, used=0
    )

  def _step_impl(self, action: Any) -> base_environment.EnvStepResult:
    reward, warn, env_done, self.used = ref.play_answer(
      self.env,
      action,
      self.used,
      SPEC["max_actions_per_traj"],
      SPEC["format_penalty"],
    )
    done = env_done or self.used >= SPEC["max_actions_per_traj"]
    return base_environment.EnvStepResult(
      observation=dict(
        observation=self.env.text("grid"),
        reward=reward,
        warn=warn,
        used=self.used,
      ),
      reward=reward,
      done=done,
      info=dict(success=self.env.solved()),
    )


class SokobanAgent(base_agent.ConversationAgentBase):
  """RAGEN's prompt: the system prompt, then per turn the state, the last
  reward and the actions left; the reply's ``<answer>`` parsed as RAGEN
  does (``reference.text.parse``)."""

  def __init__(self, system_prompt: str = ""):
    del system_prompt
    super().__init__(system_prompt=SPEC["system"])

  def update_from_env(self, observation, reward, done, info=None, **kwargs):
    if not done:
      observation = user_text(
        turn=len(self._trajectory.steps),
        observation=observation["observation"],
        reward=observation["reward"],
        warn=observation["warn"],
        actions_left=SPEC["max_actions_per_traj"] - observation["used"],
        hint=SPEC["max_new_tokens"],
      )
    super().update_from_env(observation, reward, done, info or {})
    self.cur_step = agent_types.Step(observation=observation)

  def update_from_model(self, response: str, **kwargs) -> agent_types.Action:
    REPLIES.append(time.perf_counter())
    # Tunix's sampler drops the stop token it ended on (``</answer>``
    # nearly always, for the warm-started policy); the reply is closed.
    closed = response if "</answer>" in response else response + "</answer>"
    _, actions = ref_text.parse(
      ("<answer>" + closed).encode(),
      think=False,
      markers=ref_text.MARKERS,
      max_actions=SPEC["max_actions_per_turn"],
      action_names=ACTIONS,
    )
    self._messages.append({"role": "assistant", "content": response})
    self._trajectory.steps.append(self.cur_step)
    step = self._trajectory.steps[-1]
    step.model_response = response
    step.action = actions
    return agent_types.Action(action=actions)


class AnswerPrefilledQwenParser(parser.QwenChatTemplateParser):
  """Qwen's ChatML with RAGEN's reply prefix: each assistant turn starts
  with ``<answer>`` already written, as in the JAX rollout's prompt."""

  def _get_assistant_token(self) -> str:
    return "<|im_start|>assistant\n<answer>"


class Recorder:
  """A Tunix metrics backend (``backend_kwargs["custom_backend"]``) that
  keeps every scalar Tunix logs, with its step."""

  def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
    EVENTS.append(
      (event, float(np.mean(value)), kwargs.get("step"), time.perf_counter())
    )

  def close(self) -> None:
    pass


class Clock:
  """The dataset Tunix trains on, timing its requests: the learner asks
  for the next batch of levels when an iteration ends."""

  def __init__(self, batches: list[dict[str, np.ndarray]]):
    self.batches = batches
    self.times: list[float] = []

  def __iter__(self):
    for batch in self.batches:
      self.times.append(time.perf_counter())
      yield batch


def _cluster(actor, reference, tok, mesh, budget: int, per_minibatch: int):
  """Tunix's RL cluster: actor, reference and rollout on one mesh, the
  JAX side's optimizer, minibatches and sampling."""
  return rl_cluster_lib.RLCluster(
    actor=actor,
    reference=reference,
    tokenizer=tok,
    cluster_config=rl_cluster_lib.ClusterConfig(
      role_to_mesh={
        rl_cluster_lib.Role.ACTOR: mesh,
        rl_cluster_lib.Role.REFERENCE: mesh,
        rl_cluster_lib.Role.ROLLOUT: mesh,
      },
      rollout_engine="vanilla",
      offload_to_cpu=False,
      training_config=rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(
          optax.clip_by_global_norm(SPEC["grad_clip"]),
          optax.adamw(
            SPEC["lr"],
            b1=SPEC["b1"],
            b2=SPEC["b2"],
            weight_decay=SPEC["weight_decay"],
          ),
        ),
        eval_every_n_steps=10**9,
        max_steps=len(SPEC["levels"]),
        mini_batch_size=per_minibatch,
        train_micro_batch_size=per_minibatch,
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(
          log_dir=SPEC["workdir"],
          flush_every_n_steps=1,
          backend_kwargs={"custom_backend": [Recorder]},
        ),
      ),
      rollout_config=base_rollout.RolloutConfig(
        max_prompt_length=SPEC["max_context"],
        max_tokens_to_generate=budget,
        kv_cache_size=SPEC["max_context"] + budget + 256,
        temperature=SPEC["temperature"],
        top_p=1.0,
        top_k=None,
        eos_tokens=[tok.convert_tokens_to_ids(t) for t in SPEC["stop"]],
        return_logprobs=True,
      ),
    ),
  )


def _iterations(marks: list[float], groups: int) -> list[dict[str, float]]:
  """Each training step's time, generated tokens, return and compiles,
  from the step boundaries ``marks`` and the events Tunix logged."""
  lengths = {
    step: value
    for name, value, step, _ in EVENTS
    if name == "generation/train/completions/mean_length"
  }
  compiles = [
    t
    for name, _, _, t in EVENTS
    if name == "/jax/core/compile/backend_compile_duration"
  ]
  returns = {
    step: value
    for name, value, step, _ in EVENTS
    if name == "trajectory_rewards/train/mean"
  }
  within = lambda times, a, b: sum(a <= t < b for t in times)
  iterations = [
    dict(
      seconds=b - a,
      # Tunix logs each step's mean trained reply tokens per episode; its
      # sampler drops the stop token that ended each reply, which it did
      # generate.
      generated_tokens=lengths[k] * groups * SPEC["group_size"]
      + within(REPLIES, a, b),
      replies=within(REPLIES, a, b),
      episode_return=returns[k],
      compiles=within(compiles, a, b),
    )
    for k, (a, b) in enumerate(itertools.pairwise(marks))
  ]
  return iterations


def _budget(chat, tok) -> int:
  """The episode's token budget after its first prompt (Tunix counts both
  replies and later prompts against it): what the JAX side's context
  leaves after the same prompt."""
  first = SokobanAgent()
  obs, _ = SokobanEnv(
    {"level": np.asarray([json.dumps(SPEC["levels"][0][0])])}
  ).reset()
  first.update_from_env(obs, 0.0, False)
  prompt = chat.parse(
    first.chat_completions, add_generation_prompt=True, is_first_msg=True
  )
  return SPEC["max_context"] - len(tok.encode(prompt))


def main(spec_path: str, out_path: str) -> None:
  with open(spec_path) as f:
    SPEC.update(json.load(f))
  logging.getLogger().setLevel(os.environ.get("TUNIX_LOG", "WARNING"))
  tok = transformers.PreTrainedTokenizerFast(
    tokenizer_file=os.path.join(SPEC["tokenizer"], "tokenizer.json"),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
  )
  cfg = model_config(SPEC["checkpoint"])
  # One shared mesh for actor, reference and rollout (as the example's
  # single-host recipe), its axes in Auto mode as Tunix shards them.
  mesh = jax.make_mesh(
    (1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2
  )
  actor = qwen2_params.create_model_from_safe_tensors(
    SPEC["checkpoint"], cfg, mesh, dtype=jax.numpy.float32
  )
  reference = qwen2_params.create_model_from_safe_tensors(
    SPEC["checkpoint"], cfg, mesh, dtype=jax.numpy.float32
  )
  groups = SPEC["env_groups"]
  per_minibatch = groups // SPEC["minibatches"]
  chat = AnswerPrefilledQwenParser(tok)
  budget = _budget(chat, tok)
  cluster = _cluster(actor, reference, tok, mesh, budget, per_minibatch)
  learner = agentic_grpo_learner.GRPOLearner(
    rl_cluster=cluster,
    algo_config=agentic_grpo_learner.GRPOConfig(
      num_generations=SPEC["group_size"],
      num_iterations=1,
      max_response_length=budget,
      beta=0.0,
      epsilon=SPEC["clip_low"],
      epsilon_high=SPEC["clip_high"],
      loss_agg_mode="token-mean",
      max_concurrency=groups * SPEC["group_size"],
    ),
    chat_parser=chat,
    agent_class=SokobanAgent,
    env_class=SokobanEnv,
  )
  clock = Clock(
    [
      {"level": np.asarray([json.dumps(lv) for lv in levels])}
      for levels in SPEC["levels"]
    ]
  )
  learner.train(clock)
  iterations = _iterations([*clock.times, time.perf_counter()], groups)
  with open(out_path, "w") as f:
    json.dump(dict(iterations=iterations), f)


if __name__ == "__main__":
  main(*sys.argv[1:])
