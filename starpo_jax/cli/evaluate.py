"""``python -m starpo_jax.evaluate``: evaluates any checkpoint of a run::

  python -m starpo_jax.evaluate --workdir=runs/sokoban
  python -m starpo_jax.evaluate --workdir=runs/sokoban --step=250 \
    --episodes=512 --samples=4 --temperatures=0.5,0
  python -m starpo_jax.evaluate --ckpt=runs/other/checkpoints \
    --config=configs/sokoban.py --config.rollout.max_turns=10
  python -m starpo_jax.evaluate \
    --config=configs/frozen_lake.py:model=smollm2-135m   # zero-shot
  python -m starpo_jax.evaluate --workdir=runs/sokoban --variants=ragen

``--workdir`` rebuilds the run from the ``config.json`` training wrote
there; ``--ckpt`` with ``--config`` evaluates a checkpoint under any config
its policy fits; ``--config`` alone evaluates the config's initial policy
(a pretrained model zero-shot; default ``--out``:
``runs/ENV/eval/initial-MODEL``). It writes to ``--out`` (default
``WORKDIR/eval/stepN``)
``summary.json`` (per environment and temperature: success with its 95%
interval, pass@samples, actions, turns, response length, valid and
effective action rates; what the replies say, ``replies``: how often
the reasoning copies the prompt, distinct reasoning, reply length, each
action's share; the random valid player beside it; each
environment's registered name and settings), and per
environment and temperature every episode as a JSON line
(``{env}_t{T}.jsonl``: each turn's prompt, reply, executed actions and
reward) and the first ``--transcripts`` as readable text (``.txt``).
``--variants=ragen`` evaluates on RAGEN's validation variants of the
environment as well (``presets.EVAL_VARIANTS``), whatever the run was
configured with.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from starpo_jax.cli import app as cli_app
from starpo_jax.run import assembly, evaluator


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
          f"{st['response_length']:.1f} tokens a reply "
          f"({st['think_tokens']:.1f} reasoning), format "
          f"{100 * st['format_rate']:.1f}%, valid "
          f"{100 * st['valid_action_rate']:.1f}%"
        )
        if "replies" in st:
          r = st["replies"]
          line += (
            f"; reasoning copies the prompt in {100 * r['copied']:.1f}% "
            f"of turns, {100 * r['distinct_reasoning']:.1f}% distinct"
          )
      lines.append(line)
  return "\n".join(lines)


def _source(workdir: str | None, ckpt: str | None, config: Any) -> str | None:
  """The run or checkpoint directory to evaluate (None: the config's
  initial policy); a request that names none or both is refused."""
  if workdir is not None and ckpt is not None:
    cli_app.refuse("give one of --workdir and --ckpt, not both", "evaluate")
  source = workdir or ckpt
  if source is None and config is None:
    cli_app.refuse(
      "give --workdir, --ckpt with --config, or --config alone "
      "(the config's initial policy)",
      "evaluate",
    )
  if source is not None and not os.path.isdir(source):
    cli_app.refuse(f"{source!r} is not a directory", "evaluate")
  return source


def _temperatures(values: list[str] | None) -> tuple[float, ...] | None:
  """``--temperatures`` as numbers (None: the config's)."""
  if values is None:
    return None
  try:
    return tuple(float(x) for x in values)
  except ValueError:
    raise assembly.ConfigError(
      f"--temperatures={','.join(values)}: not numbers"
    ) from None


def _flags():
  """The command's flags, in their own ``FlagValues`` (the command runs
  inside tests too), by name."""
  from absl import flags
  from ml_collections import config_flags

  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (default: WORKDIR/config.json).",
    flag_values=fv,
  )
  flags.DEFINE_string("workdir", None, "A run directory.", flag_values=fv)
  flags.DEFINE_string(
    "ckpt", None, "A checkpoint directory (needs --config).", flag_values=fv
  )
  flags.DEFINE_integer(
    "step", None, "Checkpoint step (latest).", flag_values=fv
  )
  flags.DEFINE_string("out", None, "Output directory.", flag_values=fv)
  flags.DEFINE_integer(
    "episodes", None, "Held-out levels (train.eval_episodes).", flag_values=fv
  )
  flags.DEFINE_integer("samples", 1, "Plays per level.", flag_values=fv)
  flags.DEFINE_list(
    "temperatures",
    None,
    "e.g. 0.5,0 (train.eval_temperatures).",
    flag_values=fv,
  )
  flags.DEFINE_integer(
    "transcripts", 8, "Episodes written as readable text.", flag_values=fv
  )
  flags.DEFINE_string(
    "variants",
    None,
    "ragen: RAGEN's validation variants of the environment as well.",
    flag_values=fv,
  )
  return fv


def _with_variants(cfg: Any, which: str | None) -> Any:
  """``cfg`` evaluating ``which`` validation variants as well (None:
  as it is)."""
  import dataclasses

  from starpo_jax.run import assembly, presets

  if which is None:
    return cfg
  run = assembly.parse(cfg)
  try:
    if run.env.mixture:
      variants = presets.mixture_variants(run.env.mixture, which)
    else:
      named = presets.variants_preset(run.env.name, which)
      variants = presets.PRESETS[named]["env.eval_variants"]
  except ValueError as e:
    raise assembly.ConfigError(str(e)) from None
  env = dataclasses.replace(run.env, eval_variants=variants)
  return dataclasses.replace(run, env=env)


def main(argv: list[str]) -> dict[str, Any]:
  """The command line (``argv[0]`` is the program name)."""

  fv = _flags()
  if cli_app.wants_help(argv):
    print(__doc__)
    print(fv.get_help())
    raise SystemExit(0)
  cli_app.parse_flags(fv, argv, "evaluate")
  source = _source(fv.workdir, fv.ckpt, fv.config)
  cfg = fv.config
  try:
    if cfg is None:
      if fv.ckpt is not None:
        raise assembly.ConfigError("--ckpt needs --config")
      cfg = assembly.load_config(source)
    cfg = _with_variants(cfg, fv.variants)
    summary = evaluator.evaluate_checkpoint(
      cfg,
      source,
      step=fv.step,
      out=fv.out,
      episodes=fv.episodes,
      samples=fv.samples,
      temperatures=_temperatures(fv.temperatures),
      transcripts=fv.transcripts,
    )
  except assembly.ConfigError as e:
    if cli_app.debugging(argv):
      raise
    cli_app.refuse(str(e), "evaluate")
  print(describe(summary))
  print(f"summary and transcripts in {summary['out']}")
  return summary


def entry() -> None:
  """``starpo-evaluate`` and ``python -m starpo_jax.evaluate``."""
  cli_app.quiet_libtpu()
  main(sys.argv)


if __name__ == "__main__":
  entry()
