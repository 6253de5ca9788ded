"""The training loop: assembly.build or resume, step, log, evaluate, checkpoint.

  train.run(config, workdir)

Everything that can be checked is checked before anything compiles
(``assembly.build``): the config, the environment, the checkpoint, the
workdir. A run resumes automatically from the latest checkpoint in its
workdir, replaying exactly the steps an uninterrupted run would take.
"""

from __future__ import annotations

import os
import textwrap
import time
from typing import Any

import jax
import jax.numpy as jnp

from starpo_jax import sharding
from starpo_jax.agent.mixture import Mixture
from starpo_jax.algo import diagnostics
from starpo_jax.algo.state import Learner, TrainState
from starpo_jax.models import lora
from starpo_jax.run import (
  assembly,
  checkpoint,
  evaluator,
  files,
  preemption,
  presets,
  stopping,
)
from starpo_jax.run import metrics as metrics_lib


class NonFiniteError(RuntimeError):
  """Training produced non-finite losses for too many steps in a row."""


def _check_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test{jax.process_index()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise assembly.ConfigError(
      f"workdir {workdir!r} is not writable: {e}"
    ) from None


class _Run:
  """The loop's bookkeeping: when to evaluate and checkpoint, logging,
  transcripts, and the stop on repeated non-finite steps."""

  def __init__(
    self, setup: assembly.Setup, learner: Learner, workdir: str
  ) -> None:
    c = setup.config
    self.setup, self.workdir = setup, workdir
    self.primary = jax.process_index() == 0
    self.sft_steps = setup.config.sft.steps
    self.total = self.sft_steps + c.train.steps
    warm_start_end = (self.sft_steps,) if self.sft_steps else ()
    self.ckpt = checkpoint.Checkpointer(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      c.train.keep_checkpoints,
      also_keep=warm_start_end,
    )
    self.writer = metrics_lib.MetricWriter(workdir, enabled=self.primary)
    self.progress = metrics_lib.Progress(self.total, enabled=self.primary)
    self.profile = metrics_lib.Profile(c.train.profile, workdir)
    self.evaluator = (
      evaluator.make_evaluator(setup, learner) if self.every else None
    )
    self.evals: dict[int, float] = {}
    # A LoRA run's frozen weights, as its checkpoints describe them.
    self.base: dict[str, str] | None = None
    self.preemption = preemption.Preemption()

  def save_config(self) -> None:
    """Writes what ``python -m starpo_jax.evaluate --workdir`` rebuilds the
    run from (once its checkpoint restored: a config that does not fit it
    replaces nothing), with the paths it reads from absolute."""
    if not self.primary:
      return
    files.write_atomically(
      os.path.join(self.workdir, assembly.CONFIG_FILE),
      assembly.to_json(self.setup.config),
    )

  @property
  def every(self) -> int:
    return self.setup.config.train.eval_every

  def evaluating(self, step: int) -> bool:
    boundary = step in (0, self.sft_steps, self.total)
    return self.every > 0 and (step % self.every == 0 or boundary)

  def checkpointing(self, step: int) -> bool:
    every = self.setup.config.train.checkpoint_every
    return step % every == 0 or step in (self.sft_steps, self.total)

  def print(self, line: str) -> None:
    if self.primary:
      print(line, flush=True)

  def stop_early(self, step: int, reason: str) -> None:
    line = f"early stop at step {step}: {reason}"
    self.print(line)
    if self.primary:
      files.write_atomically(
        os.path.join(self.workdir, "early_stop.txt"), line + "\n"
      )

  def evaluate(
    self, step: int, params: Any, verbose: bool = False
  ) -> dict[str, float]:
    """Held-out evaluation; ``verbose``: a line per environment and
    temperature as each is done."""
    t0 = time.perf_counter()
    metrics, transcripts = self.evaluator(
      params, self.print if verbose else None
    )
    metrics["time/eval_s"] = time.perf_counter() - t0
    self.evals[step] = metrics["eval/success"]
    if self.primary and transcripts:
      where = os.path.join(self.workdir, "transcripts")
      os.makedirs(where, exist_ok=True)
      for name, body in transcripts.items():
        files.write_atomically(
          os.path.join(where, f"step{step:06d}_{name}.txt"), body
        )
    return metrics

  def describe(self, metrics: dict[str, float]) -> str:
    temps = self.setup.config.train.eval_temperatures
    out = []
    for i, t in enumerate(temps):
      at = "" if i == 0 else f"@t{t:g}"
      get = lambda stat, at=at: 100 * metrics[f"eval/{stat}{at}"]
      out.append(
        f"{get('success'):.1f}% [{get('success_lo'):.1f}, "
        f"{get('success_hi'):.1f}] at t={t:g}"
      )
    line = (
      "eval success "
      + ", ".join(out)
      + f"; random valid player {100 * metrics['eval/random_success']:.1f}%"
    )
    # Further held-out environments (env.eval_variants) at the first
    # temperature, each beside its random player.
    for name in self.evaluator.envs:
      if name != "eval":
        get = lambda stat, name=name: 100 * metrics[f"{name}/{stat}"]
        line += (
          f"; {name} {get('success'):.1f}% [{get('success_lo'):.1f}, "
          f"{get('success_hi'):.1f}] (random {get('random_success'):.1f}%)"
        )
    return line

  def check_finite(self, step: int, metrics: dict[str, float]) -> None:
    streak = int(metrics["train/nonfinite_streak"])
    if streak < self.setup.config.train.max_nonfinite_steps:
      return
    self.ckpt.wait()
    good = self.ckpt.latest_step()
    where = (
      f"the last good checkpoint is step {good} in {self.workdir}"
      if good is not None
      else "no checkpoint had been saved yet"
    )
    raise NonFiniteError(
      f"stopped at step {step}: {streak} consecutive steps with a "
      f"non-finite loss (their updates were skipped); {where}"
    )

  def close(self) -> None:
    self.preemption.close()
    self.profile.stop()
    self.ckpt.wait()
    self.ckpt.close()
    self.writer.close()
    self.progress.close()


def _restore(run: _Run, state: TrainState) -> TrainState:
  """The workdir's latest checkpoint; else, with ``train.init_from``, a
  fresh state whose policy comes from that run. A LoRA run's checkpoints
  hold its adapters: its weights come from that run (or are created) each
  time, and must be the ones its adapters were trained on."""
  start = run.ckpt.latest_step()
  source = run.setup.config.train.init_from
  adapters = run.setup.model_cfg.lora is not None
  if source and (start is None or adapters):
    if start is None:
      run.print(f"starting from the policy of {source}")
    state = assembly.policy_from(state, run.setup, source)
  if adapters:
    run.base = assembly.base_of(run.setup, state.policy.filter(lora.WEIGHTS))
  if start is None:
    # A run killed before its first checkpoint starts again from step 0.
    run.writer.truncate_after(0)
    return state
  try:
    state = run.ckpt.restore(start, state, run.base)
  except (checkpoint.BaseMismatch, checkpoint.DamagedCheckpoint) as e:
    raise assembly.ConfigError(str(e)) from None
  run.writer.truncate_after(start)
  run.print(f"resumed from step {start} in {run.workdir}")
  return state


def _evaluate_start(run: _Run, state: TrainState, t_run: float) -> None:
  """Step 0's held-out evaluation, of the untrained (or loaded) policy."""
  start = "starting policy" if run.setup.config.train.init_from else "untrained"
  t = run.setup.config.train
  temps = " and ".join(f"t={x:g}" for x in t.eval_temperatures)
  run.print(
    f"evaluating the {start} policy on {t.eval_episodes} held-out levels "
    f"at {temps} (each compiles on first use)"
  )
  first = run.evaluate(0, state.policy, verbose=True)
  first["time/elapsed_s"] = time.perf_counter() - t_run
  run.writer.write(0, first)
  run.print(f"{start}: {run.describe(first)}")


def brief(setup: assembly.Setup, parameters: int, workdir: str) -> list[str]:
  """What a run is about to do, in a few lines."""
  c = setup.config
  rc, algo, f = c.rollout, c.algo, c.filter
  m = setup.model_cfg
  steps = f"{c.train.steps} RL steps"
  if c.sft.steps:
    steps = f"{c.sft.steps} warm-start steps, then {steps}"
  kept = (
    "every group"
    if f.strategy == "top_p" and f.value >= 1
    else f"groups by {f.metric}, {f.strategy} {f.value:g}"
  )
  name = c.env.name
  if isinstance(setup.env, Mixture):
    name = f"mixture of {setup.env.describe()}"
    if kept != "every group":
      kept += (
        " of each part apart (filter.by_part)"
        if f.by_part
        else " of all parts ranked together (RAGEN's rule)"
      )
  devices = jax.devices()
  return [
    f"{name}: {steps} of {rc.batch} episodes ({rc.env_groups} groups "
    f"x {rc.group_size}), "
    + (
      f"up to {rc.max_turns} turns of "
      if rc.max_turns > 1
      else "one turn of up to "
    )
    + f"{rc.max_new_tokens} tokens",
    f"algorithm: {algo.adv_estimator} advantages, kept: {kept}, clip "
    f"{algo.clip_low:g}/{algo.clip_high:g}, KL {algo.kl_coef:g}, "
    f"lr {c.optim.lr:g}",
    f"model: {c.model.ckpt or c.model.preset} ({m.num_layers} layers, "
    f"{m.hidden_size} wide, {parameters / 1e6:.2f}M parameters, {m.dtype}"
    + (f", LoRA rank {m.lora.rank}" if m.lora else "")
    + f") on {len(devices)} {devices[0].platform} device(s)",
    *textwrap.wrap(
      "settings beside the defaults: "
      + (", ".join(assembly.changed_settings(c)) or "none"),
      width=79,
      subsequent_indent="  ",
      break_on_hyphens=False,
    ),
    *presets.notes(c),
    f"writing to {workdir}; every setting, resolved: "
    f"{os.path.join(workdir, assembly.CONFIG_FILE)}",
  ]


def _host_metrics(metrics: dict[str, Any], t0: float) -> dict[str, float]:
  """A step's device metrics as host floats, with its time and rate.

  The step runs asynchronously: its time is taken once its metrics are on
  the host, from ``t0``, its call (with ``log_every`` > 1 that includes
  finishing the unlogged steps queued before it)."""
  out = {k: float(sharding.local_value(v)) for k, v in metrics.items()}
  step_s = time.perf_counter() - t0
  out = diagnostics.logged(out)
  out["time/step_s"] = step_s
  if "rollout/generated_tokens" in out:
    out["time/tokens_per_s"] = out["rollout/generated_tokens"] / step_s
  return out


def run(config: Any, workdir: str) -> dict[str, Any]:
  """Runs ``config.sft.steps`` warm-start steps, then ``config.train.steps``
  RL steps, resuming from ``workdir`` (``config``: a ``ConfigDict`` or a
  parsed ``RunConfig``).

  Returns:
    The final summary: steps, last metrics, held-out success by step.

  Raises:
    assembly.ConfigError: a bad setting or workdir, before anything compiles.
    NonFiniteError: too many consecutive non-finite steps (the last good
      checkpoint is kept).

  An early-stopping rule that fires (``config.train.early_stop``,
  ``stopping.py``) ends the run at that step with a checkpoint; the reason
  is printed, written to ``workdir/early_stop.txt`` and returned. A
  SIGTERM or Ctrl-C (``preemption.py``) ends it after the step in progress
  with a checkpoint; the signal is returned as ``"preempted"``.
  """
  t_run = time.perf_counter()
  setup = assembly.build(config)
  _check_workdir(workdir)
  learner = assembly.make_learner(setup)
  r = _Run(setup, learner, workdir)
  try:
    return _loop(r, learner, t_run)
  finally:
    r.close()


def _start_rl(setup: assembly.Setup, learner: Learner, state: Any) -> Any:
  """The state RL starts from: the warm-started policy with fresh
  optimizer moments; its KL reference is that policy too (RAGEN's
  reference is the model RL starts from)."""
  reference = state.reference
  if setup.config.algo.uses_reference and reference is not None:
    reference = jax.tree.map(jnp.copy, state.policy)
  return state.replace(
    policy_opt=assembly.policy_optimizer_state(
      learner, state.policy, setup.mesh
    ),
    reference=reference,
  )


def _loop(run: _Run, learner: Learner, t_run: float) -> dict[str, Any]:
  """``run``'s steps, from the workdir's checkpoint to the end, an early
  stop or a preemption."""
  setup = run.setup
  state = assembly.init_state(setup, learner)
  parameters = sum(x.size for x in jax.tree.leaves(state.policy))
  for line in brief(setup, parameters, run.workdir):
    run.print(line)
  state = _restore(run, state)
  run.save_config()
  compiled = {}
  codec = sharding.replicate(setup.codec, setup.mesh)
  last: dict[str, float] = {}
  stopper = stopping.EarlyStop(setup.config.train.early_stop)
  stopped = preempted = None
  step = int(sharding.local_value(state.step))
  if step == 0 and run.evaluating(0):
    _evaluate_start(run, state, t_run)
  while step < run.total:
    t0 = time.perf_counter()
    phase = "sft" if step < run.sft_steps else "rl"
    run_step = _compiled(run, learner, compiled, phase, state)
    run.profile.before(step + 1)
    state, metrics = run_step(state, codec)
    step += 1
    run.profile.after(step, metrics)
    if step == run.sft_steps:
      state = _start_rl(setup, learner, state)
    logged, stopped = _log(run, stopper, step, phase, metrics, state, t0, t_run)
    last = logged or last
    # A signal stops the run at a step boundary, where it checkpoints;
    # the metrics of the steps run stay as an uninterrupted run logs them.
    preempted = (
      run.preemption.signal if run.preemption.requested(step) else None
    )
    if run.checkpointing(step) or stopped or preempted:
      run.ckpt.save(step, state, run.base)
    if stopped:
      run.stop_early(step, stopped)
      break
    if preempted:
      run.ckpt.wait()
      run.print(
        f"stopped by {preempted} after step {step} of {run.total}: checkpoint "
        f"saved in {run.workdir}; the same command resumes the run"
      )
      break
  seconds = time.perf_counter() - t_run
  return _summary(run, step, seconds, last, stopped, preempted)


def _compiled(run: _Run, learner: Learner, compiled: dict, phase: str, state):
  """The phase's jitted step; each compiles when it first runs (a resumed
  run may skip one)."""
  if phase not in compiled:
    name = {"sft": "warm-start", "rl": "RL"}[phase]
    run.print(f"compiling the {name} step (once; its first call runs it)")
    build = (
      assembly.compile_sft_step if phase == "sft" else assembly.compile_step
    )
    compiled[phase] = build(run.setup, state, learner)
  return compiled[phase]


def _log(
  run: _Run,
  stopper: stopping.EarlyStop,
  step: int,
  phase: str,
  metrics,
  state,
  step_start: float,
  run_start: float,
):
  """The step's metrics on the host, logged (with a held-out evaluation
  where due), and the early-stopping rule's verdict; ``(None, None)`` for
  a step that logs nothing.

  Args:
    phase: ``"sft"`` (the warm start) or ``"rl"``.
    metrics: the step's metrics, still on the device.
    step_start: when the step started (``time.perf_counter()``).
    run_start: when this process started the run.
  """
  train = run.setup.config.train
  evaluating = run.evaluating(step)
  watching = train.early_stop.enabled and phase == "rl"
  if not (evaluating or watching or step % train.log_every == 0):
    return None, None
  metrics = _host_metrics(metrics, step_start)
  if evaluating:
    metrics.update(run.evaluate(step, state.policy))
  # Wall time since this process started the run, compiles included.
  metrics["time/elapsed_s"] = time.perf_counter() - run_start
  stopped = None
  if phase == "rl":
    # The reward spread relative to its early level, rules on or off.
    stopped = stopper.after_step(metrics)
    if watching and stopped is None and "eval/success" in metrics:
      stopped = stopper.after_eval(metrics["eval/success"])
  run.writer.write(step, metrics)
  run.progress.update(step, metrics)
  if evaluating and step == run.sft_steps:
    run.print(f"after {step} warm-start steps: {run.describe(metrics)}")
  run.check_finite(step, metrics)
  return metrics, stopped


def _summary(
  run: _Run,
  step: int,
  seconds: float,
  last: dict[str, float],
  stopped: str | None,
  preempted: str | None,
) -> dict[str, Any]:
  """What ``run`` returns, and its closing lines."""
  if "eval/success" in last and not preempted:
    run.print(f"done: {step} steps in {seconds:.0f}s; {run.describe(last)}")
  run.print(f"metrics in {run.writer.path}")
  return {
    "steps": step,
    "seconds": seconds,
    "final": last,
    "eval_success": run.evals,
    "early_stop": stopped,
    "preempted": preempted,
  }
