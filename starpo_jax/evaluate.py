"""Held-out evaluation: success with a 95% interval, sampled and greedy,
beside a random player on the same levels; readable transcripts.

Validation plays levels no training step draws: training steps fold the
step number into ``key(seed)``, evaluation folds in the largest number, which
no step reaches. The levels are the same at every evaluation of a run.

As a command, it evaluates any checkpoint of a run::

  python -m starpo_jax.evaluate --workdir=runs/sokoban
  python -m starpo_jax.evaluate --workdir=runs/sokoban --step=250 \
    --episodes=512 --samples=4 --temperatures=0.5,0
  python -m starpo_jax.evaluate --ckpt=runs/other/checkpoints \
    --config=configs/sokoban.py --config.rollout.max_turns=10

``--workdir`` rebuilds the run from the ``config.json`` training wrote
there; ``--ckpt`` with ``--config`` evaluates a checkpoint under any config
its policy fits. It writes to ``--out`` (default ``WORKDIR/eval/stepN``)
``summary.json`` (per environment and temperature: success with its 95%
interval, pass@samples, actions, turns, response length, valid and
effective action rates; the random valid player beside it), and per
environment and temperature every episode as a JSON line
(``{env}_t{T}.jsonl``: each turn's prompt, reply, executed actions and
reward) and the first ``--transcripts`` as readable text (``.txt``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import jax
import numpy as np
from flax import nnx

from envs import Env, planning
from starpo_jax import diagnostics, sharding
from starpo_jax import rollout as rollout_lib
from starpo_jax.models.tokenizer import Tokenizer


def wilson_interval(successes: int, n: int, z: float = 1.96):
  """The Wilson score interval of a success rate (95% by default)."""
  if n == 0:
    return 0.0, 1.0
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def random_valid_success(
  env: Env, states: Any, actions: int, key: jax.Array
) -> jax.Array:
  """Which episodes ``[B]`` a player solves that takes up to ``actions``
  uniformly random actions among those valid in each state (never a
  malformed or unavailable answer): the bar a policy that ignores the
  board cannot pass. An environment with text answers answers once with
  its ``random_answer`` (Countdown: the numbers in a random order joined
  by random operators). Jittable; ``states`` are batched."""
  b = jax.tree.leaves(states)[0].shape[0]
  if env.spec.text_answers:
    answers = jax.vmap(env.random_answer)(states, jax.random.split(key, b))
    return jax.vmap(env.step)(states, answers)[1].success
  play = lambda s, k: planning.random_valid_play(env, s, actions, k)[1]
  return jax.vmap(play)(states, jax.random.split(key, b))


def episode_record(
  traj: Any, tokenizer: Tokenizer, action_names: tuple[str, ...], episode: int
) -> dict[str, Any]:
  """One episode turn by turn, as plain values (a JSON line): the prompt
  text the model read, its reply, the actions the environment executed
  (by name; ``"answer"`` when an environment took a text answer), the
  turn's reward (format penalty included) and whether the answer was
  well-formed and valid."""
  action_names = action_names or ("answer",)
  tokens = np.asarray(traj.tokens[episode])
  turn_ids = np.asarray(traj.turn_ids[episode])
  generated = np.asarray(traj.loss_mask[episode])
  n = int(traj.length[episode])
  tokens, turn_ids, generated = tokens[:n], turn_ids[:n], generated[:n]
  turns = []
  for k in range(int(np.sum(traj.turn_played[episode]))):
    here = turn_ids == k
    actions = np.asarray(traj.turn_actions[episode, k])
    turns.append(
      {
        "turn": k + 1,
        "prompt": tokenizer.decode(tokens[here & ~generated]),
        "reply": tokenizer.decode(tokens[here & generated]),
        "actions": [action_names[a] for a in actions if a >= 0],
        "reward": float(traj.turn_rewards[episode, k]),
        "format_ok": bool(traj.turn_format_ok[episode, k]),
        "valid": bool(traj.turn_valid[episode, k]),
        "effective": bool(traj.turn_effective[episode, k]),
      }
    )
  return {
    "episode": episode,
    "system": tokenizer.decode(tokens[turn_ids < 0]),
    "turns": turns,
    "return": float(traj.episode_return[episode]),
    "success": bool(traj.success[episode]),
    "num_actions": int(traj.num_actions[episode]),
  }


def transcript(record: dict[str, Any]) -> str:
  """An ``episode_record`` as the model saw it, with each turn's executed
  actions and reward on a line of its own in brackets."""
  out = [record["system"]]
  for t in record["turns"]:
    actions = ", ".join(t["actions"]) or "none"
    out.append(
      f"{t['prompt']}{t['reply']}\n[turn {t['turn']}: actions {actions}; "
      f"reward {t['reward']:+.2f}]\n"
    )
  status = "success" if record["success"] else "no success"
  out.append(f"[episode return {record['return']:+.2f}, {status}]")
  return "".join(out)


# Training step n draws from fold_in(key(seed), n) (the RL step and the warm
# start alike); evaluation from the last child, which no step reaches. (It was
# split(key(seed))[1], which is fold_in(key(seed), 1): the warm start's
# second step played the first held-out levels.)
HELD_OUT_CHILD = 2**32 - 1


def held_out_key(seed: int) -> jax.Array:
  """The key of the evaluation levels (never a training step's key)."""
  return jax.random.fold_in(jax.random.key(seed), HELD_OUT_CHILD)


class Evaluator:
  """Jitted held-out rollouts for each evaluation environment and
  temperature; ``evaluator(params) -> (metrics, transcripts)``.

  ``episodes`` levels, each played ``samples`` times (pass@samples). Metrics
  are named ``{env}/{stat}`` at the first temperature and
  ``{env}/{stat}@t{T}`` at the others; success comes with its 95% Wilson
  interval (``success_lo``, ``success_hi``), and ``{env}/random_success``
  is a random valid player on the same levels.
  """

  def __init__(
    self,
    *,
    envs: dict[str, Env],
    codecs: dict[str, Any],
    rollout_cfg: rollout_lib.RolloutConfig,
    policy_def: Any,
    episodes: int,
    temperatures: tuple[float, ...],
    seed: int,
    tokenizer: Tokenizer,
    transcripts: bool,
    mesh: Any = None,
    samples: int = 1,
  ) -> None:
    self.temperatures = tuple(float(t) for t in temperatures)
    self.tokenizer, self.transcripts = tokenizer, transcripts
    self.samples = samples
    self.action_names = {n: e.spec.action_names for n, e in envs.items()}
    base = dataclasses.replace(
      rollout_cfg, env_groups=episodes, group_size=samples
    )
    everywhere = sharding.replicated(mesh)
    self.runs = {}
    for name, env in envs.items():
      for t in self.temperatures:
        cfg = dataclasses.replace(base, temperature=t)
        # Replicated outputs: every host can read the summary and transcript.
        play = lambda params, codec, key, env=env, cfg=cfg: rollout_lib.rollout(
          nnx.merge(policy_def, params), codec, env, cfg, key
        )
        self.runs[(name, t)] = jax.jit(
          sharding.traced_for(mesh, play), out_shardings=everywhere
        )
    key = held_out_key(seed)
    self.key = jax.random.wrap_key_data(
      sharding.replicate(jax.random.key_data(key), mesh)
    )
    self.codecs = {n: sharding.replicate(c, mesh) for n, c in codecs.items()}
    self.random = {}
    for name, env in envs.items():
      states = rollout_lib.reset(env, base, rollout_lib.reset_key(key))
      wins = jax.jit(random_valid_success, static_argnums=(0, 2))(
        env, states, base.max_actions_per_traj, jax.random.fold_in(key, 1)
      )
      self.random[name] = _rate(np.asarray(sharding.local_value(wins)))

  def trajectories(self, params: Any) -> dict[tuple[str, float], Any]:
    """The held-out episodes (host arrays) per environment and
    temperature."""
    return {
      (name, t): jax.tree.map(
        lambda x: np.asarray(sharding.local_value(x)),
        run(params, self.codecs[name], self.key),
      )
      for (name, t), run in self.runs.items()
    }

  def stats(self, traj: Any) -> dict[str, float]:
    """Episode statistics and success with its interval."""
    out = {
      k: float(v)
      for k, v in diagnostics.summary(traj, self.samples).items()
      if self.samples > 1 or not k.startswith("pass@")
    }
    out.update(_rate(np.asarray(traj.success)))
    return out

  def __call__(self, params: Any) -> tuple[dict[str, float], dict[str, str]]:
    metrics, transcripts = {}, {}
    for (name, t), traj in self.trajectories(params).items():
      suffix = "" if t == self.temperatures[0] else f"@t{t:g}"
      for k, v in self.stats(traj).items():
        metrics[f"{name}/{k}{suffix}"] = v
      if self.transcripts:
        record = episode_record(
          traj, self.tokenizer, self.action_names[name], 0
        )
        transcripts[f"{name}_t{t:g}"] = transcript(record)
    for name, stats in self.random.items():
      for k, v in stats.items():
        metrics[f"{name}/random_{k}"] = v
    return metrics, transcripts


def _rate(success: np.ndarray) -> dict[str, float]:
  wins, n = int(np.sum(success)), int(success.size)
  lo, hi = wilson_interval(wins, n)
  return {"success": wins / max(n, 1), "success_lo": lo, "success_hi": hi}


def _label(t: float) -> str:
  return "greedy" if t == 0 else f"t{t:g}"


def evaluate_checkpoint(
  config: Any,
  source: str,
  *,
  step: int | None = None,
  out: str | None = None,
  episodes: int | None = None,
  samples: int = 1,
  temperatures: tuple[float, ...] | None = None,
  transcripts: int = 8,
) -> dict[str, Any]:
  """Evaluates the policy of ``source``'s checkpoint at ``step`` (default:
  the latest) under ``config`` and writes the summary and transcripts to
  ``out`` (default ``source/eval/step{N}``). Episode and temperature
  defaults are the config's ``train.eval_episodes`` and
  ``train.eval_temperatures``. Returns the summary.

  Raises:
    train.ConfigError: a bad setting, no checkpoint, or one that does not
      fit the config's model.
  """
  from starpo_jax import train  # the driver imports this module

  if samples < 1:
    raise train.ConfigError(f"samples must be >= 1, got {samples}")
  t = config.train
  episodes = t.eval_episodes if episodes is None else episodes
  if episodes < 1:
    raise train.ConfigError(f"episodes must be >= 1, got {episodes}")
  temperatures = tuple(
    t.eval_temperatures if temperatures is None else temperatures
  )
  setup = train.build(config)
  learner = train.make_learner(setup)
  step, params = train.load_policy(setup, source, step, what="checkpoint")
  evaluator = train.make_evaluator(
    setup,
    learner,
    episodes=episodes,
    temperatures=temperatures,
    transcripts=True,
    samples=samples,
  )
  out = out or os.path.join(source, "eval", f"step{step}")
  os.makedirs(out, exist_ok=True)
  summary: dict[str, Any] = {
    "source": os.path.abspath(source),
    "step": step,
    "levels": episodes,
    "samples": samples,
    "seed": config.seed,
    "envs": {},
  }
  for (name, temp), traj in evaluator.trajectories(params).items():
    entry = summary["envs"].setdefault(
      name, {"random_valid": evaluator.random[name]}
    )
    entry[_label(temp)] = evaluator.stats(traj)
    names = evaluator.action_names[name]
    records = [
      episode_record(traj, setup.tokenizer, names, i)
      for i in range(traj.success.shape[0])
    ]
    stem = os.path.join(out, f"{name}_{_label(temp)}")
    with open(stem + ".jsonl", "w") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")
    with open(stem + ".txt", "w") as f:
      f.write("\n\n".join(transcript(r) for r in records[:transcripts]))
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return {**summary, "out": out}


def describe(summary: dict[str, Any]) -> str:
  """The summary as a few readable lines."""
  k = summary["samples"]
  lines = [
    f"step {summary['step']} of {summary['source']}: {summary['levels']} "
    f"held-out levels x {k} samples"
  ]
  for name, entry in summary["envs"].items():
    for label, st in entry.items():
      who = "random valid player" if label == "random_valid" else label
      line = (
        f"  {name:>14} {who:>20}: success {100 * st['success']:5.1f}% "
        f"[{100 * st['success_lo']:.1f}, {100 * st['success_hi']:.1f}]"
      )
      if label != "random_valid":
        if k > 1:
          line += f", pass@{k} {100 * st[f'pass@{k}']:.1f}%"
        line += (
          f", {st['num_actions']:.2f} actions, "
          f"{st['response_length']:.1f} tokens a reply, valid "
          f"{100 * st['valid_action_rate']:.1f}%"
        )
      lines.append(line)
  return "\n".join(lines)


def main(argv: list[str]) -> dict[str, Any]:
  """The command line (``argv[0]`` is the program name)."""
  from absl import flags
  from ml_collections import config_flags

  from starpo_jax import train

  fv = flags.FlagValues()
  config = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (default: WORKDIR/config.json).",
    flag_values=fv,
  )
  workdir = flags.DEFINE_string(
    "workdir", None, "A run directory.", flag_values=fv
  )
  ckpt = flags.DEFINE_string(
    "ckpt", None, "A checkpoint directory (needs --config).", flag_values=fv
  )
  step = flags.DEFINE_integer(
    "step", None, "Checkpoint step (latest).", flag_values=fv
  )
  out = flags.DEFINE_string("out", None, "Output directory.", flag_values=fv)
  episodes = flags.DEFINE_integer(
    "episodes", None, "Held-out levels (train.eval_episodes).", flag_values=fv
  )
  samples = flags.DEFINE_integer(
    "samples", 1, "Plays per level.", flag_values=fv
  )
  temps = flags.DEFINE_list(
    "temperatures",
    None,
    "e.g. 0.5,0 (train.eval_temperatures).",
    flag_values=fv,
  )
  shown = flags.DEFINE_integer(
    "transcripts", 8, "Episodes written as readable text.", flag_values=fv
  )
  try:
    fv(argv)
  except flags.Error as e:
    raise SystemExit(f"evaluate: {e}") from None
  if (workdir.value is None) == (ckpt.value is None):
    raise SystemExit("evaluate: give exactly one of --workdir and --ckpt")
  source = workdir.value or ckpt.value
  if not os.path.isdir(source):
    raise SystemExit(f"evaluate: {source!r} is not a directory")
  cfg = config.value
  try:
    if cfg is None:
      if ckpt.value is not None:
        raise train.ConfigError("--ckpt needs --config")
      cfg = train.load_config(source)
    temperatures = None
    if temps.value is not None:
      try:
        temperatures = tuple(float(x) for x in temps.value)
      except ValueError:
        raise train.ConfigError(
          f"--temperatures={','.join(temps.value)}: not numbers"
        ) from None
    summary = evaluate_checkpoint(
      cfg,
      source,
      step=step.value,
      out=out.value,
      episodes=episodes.value,
      samples=samples.value,
      temperatures=temperatures,
      transcripts=shown.value,
    )
  except train.ConfigError as e:
    raise SystemExit(f"evaluate: {e}") from None
  print(describe(summary))
  print(f"summary and transcripts in {summary['out']}")
  return summary


if __name__ == "__main__":
  main(sys.argv)
