"""Held-out evaluation: success with a 95% interval, sampled and greedy,
beside a random player on the same levels; readable transcripts.

Validation plays levels no training step draws: training steps fold the
step number into ``key(seed)``, evaluation folds in the largest number, which
no step reaches. The levels are the same at every evaluation of a run.

``evaluate_checkpoint`` evaluates a run's checkpoint (the command:
``python -m starpo_jax.evaluate``, ``starpo_jax/cli/evaluate.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from envs import batched
from starpo_jax import sharding
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.agent.mixture import Mixture
from starpo_jax.algo import diagnostics
from starpo_jax.algo.state import Learner
from starpo_jax.models.tokenizer import Tokenizer
from starpo_jax.run import assembly, files
from starpo_jax.run.sections import RunConfig


def wilson_interval(successes: int, n: int, z: float = 1.96):
  """The Wilson score interval of a success rate (95% by default)."""
  if n == 0:
    return 0.0, 1.0
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def random_valid_success(
  env: Any, states: Any, actions: int, key: jax.Array
) -> jax.Array:
  """Which episodes ``[B]`` a player solves that takes up to ``actions``
  uniformly random actions among those valid in each state (never a
  malformed or unavailable answer): the bar a policy that ignores the
  board cannot pass. An environment with text answers answers once with
  its ``random_answer``. ``env``: an environment ``envs.batched`` takes;
  ``states`` are batched. Jittable."""
  return batched(env).random_success(states, actions, key)


def episode_record(
  traj: Any,
  tokenizer: Tokenizer,
  action_names: tuple[str, ...],
  episode: int,
  error: str | None = None,
) -> dict[str, Any]:
  """One episode turn by turn, as plain values (a JSON line): the prompt
  text the model read, its reply, the actions the environment executed
  (by name; ``"answer"`` when an environment took a text answer), the
  turn's reward (format penalty included) and whether the answer was
  well-formed and valid; ``error``: what ended a Python environment's
  episode (``BatchEnv.errors()``), recorded when given."""
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
        "reply_tokens": int(np.sum(here & generated)),
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
    **({"error": error} if error else {}),
  }


# Words in a row that make a reply's reasoning a copy of its prompt.
COPY_WORDS = 8
_TAGS = re.compile(r"</?(?:think|answer)>")


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
  """Each ``n`` words in a row of ``text``, its tags read as spaces."""
  words = _TAGS.sub(" ", text).split()
  return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def replies_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
  """What the replies of ``episode_record``s say, for reading a policy
  without its transcripts: how many turns' reasoning (the reply before
  ``</think>``, or all of it) repeats ``COPY_WORDS`` words in a row of the
  text the episode showed the model up to that turn (``copied``), the
  share of distinct reasoning strings, the mean reply length in tokens,
  the share in the format, and each executed action's share."""
  turns, copied, seen, actions = 0, 0, set(), {}
  tokens = in_format = 0
  for record in records:
    shown = record["system"]
    for t in record["turns"]:
      shown += t["prompt"]
      reasoning = t["reply"].split("</think>")[0]
      turns += 1
      copied += bool(
        _ngrams(reasoning, COPY_WORDS) & _ngrams(shown, COPY_WORDS)
      )
      seen.add(reasoning.strip())
      tokens += t["reply_tokens"]
      in_format += t["format_ok"]
      for name in t["actions"]:
        actions[name] = actions.get(name, 0) + 1
      shown += t["reply"]
  n, acted = max(turns, 1), max(sum(actions.values()), 1)
  return {
    "turns": turns,
    "copied": copied / n,
    "distinct_reasoning": len(seen) / n,
    "reply_tokens": tokens / n,
    "format_ok": in_format / n,
    "actions": {k: v / acted for k, v in sorted(actions.items())},
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
  if record.get("error"):
    out.append(f"[environment error, the episode ended: {record['error']}]\n")
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


@dataclasses.dataclass(frozen=True)
class Plays:
  """What an evaluation plays: ``episodes`` held-out levels of the run's
  ``seed`` (``held_out_key``), each ``samples`` times (pass@samples), at
  each of ``temperatures``; whether it keeps their ``transcripts``; and
  the environments whose episodes it pools into one success (``pooled``,
  a mixture's parts)."""

  episodes: int
  temperatures: tuple[float, ...]
  seed: int
  transcripts: bool
  samples: int = 1
  pooled: tuple[str, ...] = ()


class Evaluator:
  """Jitted held-out rollouts for each evaluation environment and
  temperature; ``evaluator(params) -> (metrics, transcripts)``.

  ``plays.episodes`` levels, each played ``plays.samples`` times. Metrics
  are named ``{env}/{stat}`` at the first temperature and
  ``{env}/{stat}@t{T}`` at the others; success comes with its 95% Wilson
  interval (``success_lo``, ``success_hi``), and ``{env}/random_success``
  is a random valid player on the same levels. ``pooled`` names the
  environments (a mixture's parts) whose episodes together make the
  ``eval/success`` (with its interval) and ``eval/random_success`` of a
  run with no single ``eval`` environment.
  """

  def __init__(
    self,
    *,
    envs: dict[str, Any],
    codecs: dict[str, Any],
    rollout_cfg: rollout_lib.RolloutConfig,
    policy_def: Any,
    plays: Plays,
    tokenizer: Tokenizer,
    mesh: Any = None,
  ) -> None:
    self.pooled = plays.pooled
    self.temperatures = tuple(float(t) for t in plays.temperatures)
    self.tokenizer, self.transcripts = tokenizer, plays.transcripts
    self.samples = samples = plays.samples
    episodes, seed = plays.episodes, plays.seed
    self.action_names = {n: e.spec.action_names for n, e in envs.items()}
    # Python environments' faults of the last evaluation, per episode.
    self.envs = {n: batched(e) for n, e in envs.items()}
    self.errors: dict[tuple[str, float], list[str | None]] = {}
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
      # The agent's own action budget: a random player given more
      # actions than the agent can take would set the bar too high.
      wins = jax.jit(random_valid_success, static_argnums=(0, 2))(
        env, states, base.action_budget, jax.random.fold_in(key, 1)
      )
      self.random[name] = _rate(np.asarray(sharding.local_value(wins)))

  def trajectories(
    self, params: Any, report: Callable[[str], None] | None = None
  ) -> dict[tuple[str, float], Any]:
    """The held-out episodes (host arrays) per environment and
    temperature; ``report``, if given, receives a line as each is done."""
    out = {}
    for i, ((name, t), run) in enumerate(self.runs.items()):
      t0 = time.perf_counter()
      out[(name, t)] = jax.tree.map(
        lambda x: np.asarray(sharding.local_value(x)),
        run(params, self.codecs[name], self.key),
      )
      self.errors[(name, t)] = list(self.envs[name].errors())
      if report is not None:
        seconds = time.perf_counter() - t0
        report(
          f"  [{i + 1}/{len(self.runs)}] {name} at t={t:g}: "
          f"{100 * float(np.mean(out[(name, t)].success)):.1f}% "
          f"({seconds:.0f} s)"
        )
    return out

  def error(self, part: tuple[str, float], episode: int) -> str | None:
    """What ended ``episode`` of a Python environment's evaluation part
    (environment name, temperature) early, if anything did."""
    errors = self.errors.get(part, [])
    return errors[episode] if episode < len(errors) else None

  def stats(self, traj: Any) -> dict[str, float]:
    """Episode statistics and success with its interval."""
    out = {
      k: float(v)
      for k, v in diagnostics.summary(traj, self.samples).items()
      if self.samples > 1 or not k.startswith("pass@")
    }
    out.update(_rate(np.asarray(traj.success)))
    return out

  def __call__(
    self, params: Any, report: Callable[[str], None] | None = None
  ) -> tuple[dict[str, float], dict[str, str]]:
    metrics, transcripts = {}, {}
    played = self.trajectories(params, report)
    for (name, t), traj in played.items():
      suffix = "" if t == self.temperatures[0] else f"@t{t:g}"
      for k, v in self.stats(traj).items():
        metrics[f"{name}/{k}{suffix}"] = v
      if self.transcripts:
        record = episode_record(
          traj,
          self.tokenizer,
          self.action_names[name],
          0,
          self.error((name, t), 0),
        )
        transcripts[f"{name}_t{t:g}"] = transcript(record)
    for name, stats in self.random.items():
      for k, v in stats.items():
        metrics[f"{name}/random_{k}"] = v
    metrics.update(self._pool(played))
    return metrics, transcripts

  def _pool(self, played: dict[tuple[str, float], Any]) -> dict[str, float]:
    """``eval/success`` (and its interval, at each temperature) and
    ``eval/random_success`` over the ``pooled`` environments' episodes."""
    if not self.pooled:
      return {}
    out = {}
    for t in self.temperatures:
      suffix = "" if t == self.temperatures[0] else f"@t{t:g}"
      wins = np.concatenate([played[(n, t)].success for n in self.pooled])
      out.update({f"eval/{k}{suffix}": v for k, v in _rate(wins).items()})
    counts = [
      (self.random[n]["success"], played[(n, self.temperatures[0])].success)
      for n in self.pooled
    ]
    total = sum(rate * ok.size for rate, ok in counts)
    n = sum(ok.size for _, ok in counts)
    out["eval/random_success"] = total / max(n, 1)
    return out


def _rate(success: np.ndarray) -> dict[str, float]:
  wins, n = int(np.sum(success)), int(success.size)
  lo, hi = wilson_interval(wins, n)
  return {"success": wins / max(n, 1), "success_lo": lo, "success_hi": hi}


def _label(t: float) -> str:
  return "greedy" if t == 0 else f"t{t:g}"


def _write_records(stem: str, records: list[dict], transcripts: int) -> None:
  """Every episode as a JSON line (``stem.jsonl``), the first
  ``transcripts`` as readable text (``stem.txt``)."""
  files.write_atomically(
    stem + ".jsonl", "".join(json.dumps(r) + "\n" for r in records)
  )
  files.write_atomically(
    stem + ".txt", "\n\n".join(transcript(r) for r in records[:transcripts])
  )


def _policy(
  setup: assembly.Setup, source: str | None, step: int | None
) -> tuple[int, Any, str, str]:
  """``(step, params, default output directory, description)`` of
  ``source``'s checkpoint at ``step``, or of the initial policy."""
  config = setup.config
  if source is None:
    model = config.model.ckpt or config.model.preset
    return (
      0,
      assembly.initial_policy(setup),
      os.path.join(
        "runs", config.env.name, "eval", f"initial-{os.path.basename(model)}"
      ),
      f"the initial policy ({setup.ckpt or config.model.preset})",
    )
  step, params = assembly.load_policy(setup, source, step, what="checkpoint")
  return (
    step,
    params,
    os.path.join(source, "eval", f"step{step}"),
    os.path.abspath(source),
  )


def _counts(
  config: RunConfig,
  episodes: int | None,
  samples: int,
  temperatures: tuple[float, ...] | None,
) -> tuple[int, tuple[float, ...]]:
  """Levels and temperatures to evaluate: as asked, else the config's."""
  if samples < 1:
    raise assembly.ConfigError(f"samples must be >= 1, got {samples}")
  t = config.train
  episodes = t.eval_episodes if episodes is None else episodes
  if episodes < 1:
    raise assembly.ConfigError(f"episodes must be >= 1, got {episodes}")
  return episodes, tuple(
    t.eval_temperatures if temperatures is None else temperatures
  )


def evaluate_checkpoint(
  config: Any,
  source: str | None,
  *,
  step: int | None = None,
  out: str | None = None,
  episodes: int | None = None,
  samples: int = 1,
  temperatures: tuple[float, ...] | None = None,
  transcripts: int = 8,
) -> dict[str, Any]:
  """Evaluates the policy of ``source``'s checkpoint at ``step`` (default:
  the latest) under ``config`` (a ``ConfigDict`` or ``RunConfig``) and
  writes the summary and transcripts to ``out`` (default
  ``source/eval/step{N}``). Without a ``source``, the config's initial
  policy (a pretrained model's zero-shot play), written by default to
  ``runs/{env}/eval/initial-{model}``. Episode and
  temperature defaults are the config's ``train.eval_episodes`` and
  ``train.eval_temperatures``. Returns the summary.

  Raises:
    assembly.ConfigError: a bad setting, no checkpoint, or one that does not
      fit the config's model.
  """
  config = assembly.parse(config)
  episodes, temperatures = _counts(config, episodes, samples, temperatures)
  setup = assembly.build(config)
  learner = assembly.make_learner(setup)
  step, params, default_out, where = _policy(setup, source, step)
  evaluator = make_evaluator(
    setup,
    learner,
    episodes=episodes,
    temperatures=temperatures,
    transcripts=True,
    samples=samples,
  )
  out = out or default_out
  os.makedirs(out, exist_ok=True)
  print(
    f"evaluating {where}, step {step}: {episodes} held-out levels x "
    f"{samples} at {', '.join(map(_label, temperatures))}, into {out} "
    "(compiling, then playing: minutes for a pretrained model on a CPU)",
    flush=True,
  )
  summary: dict[str, Any] = dict(
    source=where, step=step, levels=episodes, samples=samples, seed=config.seed
  ) | {"envs": {}}
  summary["settings"] = {n: setup.eval_settings[n] for n in setup.eval_envs}
  for (name, temp), traj in evaluator.trajectories(params).items():
    entry = summary["envs"].setdefault(
      name, {"random_valid": evaluator.random[name]}
    )
    entry[_label(temp)] = _write_episodes(
      out, evaluator, setup, (name, temp), traj, transcripts
    )
  files.write_atomically(
    os.path.join(out, "summary.json"), json.dumps(summary, indent=1)
  )
  return {**summary, "out": out}


def _write_episodes(out, evaluator, setup, part, traj, transcripts):
  """One part's (environment name, temperature) episodes as JSON lines,
  and ``transcripts`` of them as text, in ``out``; returns their
  statistics and what their replies say (``replies_summary``)."""
  name, temp = part
  records = [
    episode_record(
      traj,
      setup.tokenizer,
      evaluator.action_names[name],
      i,
      evaluator.error(part, i),
    )
    for i in range(traj.success.shape[0])
  ]
  _write_records(
    os.path.join(out, f"{name}_{_label(temp)}"), records, transcripts
  )
  return {**evaluator.stats(traj), "replies": replies_summary(records)}


def make_evaluator(
  setup: assembly.Setup,
  learner: Learner,
  *,
  episodes: int | None = None,
  temperatures: tuple[float, ...] | None = None,
  transcripts: bool | None = None,
  samples: int = 1,
) -> Evaluator:
  """Held-out evaluation as the config asks for it; the keywords override
  the config's ``train.eval_episodes``, ``eval_temperatures`` and
  ``transcripts``."""
  t = setup.config.train
  pick = lambda value, default: default if value is None else value
  return Evaluator(
    envs=setup.eval_envs,
    codecs=setup.eval_codecs,
    rollout_cfg=setup.config.rollout,
    policy_def=learner.policy_def,
    plays=Plays(
      episodes=pick(episodes, t.eval_episodes),
      temperatures=tuple(pick(temperatures, t.eval_temperatures)),
      seed=setup.config.seed,
      transcripts=pick(transcripts, t.transcripts),
      samples=samples,
      pooled=setup.env.tags if isinstance(setup.env, Mixture) else (),
    ),
    tokenizer=setup.tokenizer,
    mesh=setup.mesh,
  )
