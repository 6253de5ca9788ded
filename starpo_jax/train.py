"""The training driver: build or resume, loop, log, evaluate, checkpoint.

  train.run(config, workdir)

Everything that can be checked is checked before anything compiles: the
config (unknown keys and wrong types are refused by ``ml_collections``;
values here), the environment, the checkpoint, the workdir. A run resumes
automatically from the latest checkpoint in its workdir, replaying exactly
the steps an uninterrupted run would take.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

import envs
from starpo_jax import (
  checkpoint,
  evaluate,
  filtering,
  rollout,
  sharding,
  text,
)
from starpo_jax import logging as log_lib
from starpo_jax.models import hf, transformer
from starpo_jax.models import tokenizer as tokenizer_lib
from starpo_jax.step import AlgoConfig, TrainState, make_step


class ConfigError(ValueError):
  """A setting that cannot work; the message names it."""


class NonFiniteError(RuntimeError):
  """Training produced non-finite losses for too many steps in a row."""


@dataclasses.dataclass
class Setup:
  """Everything a run is made of, built and checked on the host."""

  config: ml_collections.ConfigDict
  env: Any
  eval_envs: dict[str, Any]
  tokenizer: tokenizer_lib.Tokenizer
  rollout_cfg: rollout.RolloutConfig
  algo: AlgoConfig
  filter_cfg: filtering.FilterConfig
  model_cfg: transformer.ModelConfig
  codec: text.Codec
  eval_codecs: dict[str, text.Codec]
  mesh: Any


def _dataclass_from(cls, section: ml_collections.ConfigDict, name: str):
  fields = {f.name for f in dataclasses.fields(cls)}
  values = dict(section)
  try:
    return cls(**{k: v for k, v in values.items() if k in fields})
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.{name}: {e}") from None


def build(
  config: ml_collections.ConfigDict,
  shapes_only: bool = False,
  devices: Any = None,
) -> Setup:
  """Checks the config and builds environments, tokenizer and codecs.

  With ``shapes_only`` (the compile check), a preset without a checkpoint
  or tokenizer gets the compact tokenizer: token ids change, shapes do not.
  ``devices`` (default: all) make the mesh.
  """
  try:
    env = envs.make(config.env.name, **config.env.kwargs)
    eval_envs = {
      "eval": envs.make(
        config.env.name, **{**config.env.kwargs, **config.env.eval_kwargs}
      )
    }
  except ValueError as e:
    raise ConfigError(f"config.env: {e}") from None
  if config.env.eval_kwargs:
    eval_envs["eval_train_env"] = env
  rcfg = _dataclass_from(rollout.RolloutConfig, config.rollout, "rollout")
  algo = _dataclass_from(AlgoConfig, config.algo, "algo")
  filter_cfg = _dataclass_from(filtering.FilterConfig, config.filter, "filter")
  if rcfg.batch % algo.minibatches:
    raise ConfigError(
      f"config.algo.minibatches={algo.minibatches} must divide the "
      f"{rcfg.batch} episodes (rollout.env_groups x rollout.group_size)"
    )
  settings = rcfg.prompt_settings()
  m = config.model
  if m.preset not in transformer.PRESETS:
    raise ConfigError(
      f"config.model.preset={m.preset!r}; known: {sorted(transformer.PRESETS)}"
    )
  tok_path = m.tokenizer or m.ckpt
  if tok_path:
    tok = tokenizer_lib.Tokenizer.load(tok_path)
  elif m.preset == "tiny" or shapes_only:
    pieces = []
    for e in (env, *eval_envs.values()):
      pieces += text.prompt_pieces(e.spec, settings)
    tok = tokenizer_lib.build_compact(pieces)
  else:
    raise ConfigError(
      f"config.model: preset {m.preset!r} needs model.ckpt or model.tokenizer"
    )
  if m.ckpt:
    model_cfg = hf.read_config(m.ckpt).replace(
      dtype=m.dtype, param_dtype=m.param_dtype
    )
  elif m.preset == "tiny":
    model_cfg = transformer.ModelConfig(
      **{
        **dataclasses.asdict(transformer.PRESETS["tiny"]),
        "rope_scaling": None,
        "vocab_size": tok.vocab_size,
        "hidden_size": m.hidden_size,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "intermediate_size": m.intermediate_size,
        "dtype": m.dtype,
        "param_dtype": m.param_dtype,
      }
    )
  else:
    model_cfg = transformer.PRESETS[m.preset].replace(
      dtype=m.dtype, param_dtype=m.param_dtype
    )
  model_cfg = model_cfg.replace(remat=bool(m.remat))
  try:
    model_cfg = transformer.validate(model_cfg)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if model_cfg.vocab_size < tok.vocab_size:
    raise ConfigError(
      f"config.model: the tokenizer has {tok.vocab_size} tokens, more than "
      f"the model's vocab_size={model_cfg.vocab_size}"
    )
  codec = text.Codec.build(tok, env.spec, settings, model_cfg.vocab_size)
  eval_codecs = {
    name: text.Codec.build(tok, e.spec, settings, model_cfg.vocab_size)
    for name, e in eval_envs.items()
  }
  try:
    mesh = sharding.make_mesh(config.mesh.shape, devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return Setup(
    config,
    env,
    eval_envs,
    tok,
    rcfg,
    algo,
    filter_cfg,
    model_cfg,
    codec,
    eval_codecs,
    mesh,
  )


def _optimizer(lr: float, o: ml_collections.ConfigDict):
  schedule = (
    optax.linear_schedule(0.0, lr, o.warmup_steps) if o.warmup_steps else lr
  )
  return optax.chain(
    optax.clip_by_global_norm(o.grad_clip),
    optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
  )


def _parameters(setup: Setup, value_head: bool, seed: int):
  """A model's graph definition and parameters, created already sharded
  over ``setup.mesh`` (no full copy on one device)."""
  m = setup.config.model
  cfg = setup.model_cfg.replace(value_head=value_head)
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract)
  shardings = sharding.state_shardings(
    abstract_params, setup.mesh, setup.config.logical_axis_rules
  )
  if m.ckpt:
    model = hf.load(
      m.ckpt,
      dtype=m.dtype,
      param_dtype=m.param_dtype,
      value_head=value_head,
      shardings=shardings,
    )
    return graphdef, nnx.split(model)[1]
  create = jax.jit(
    lambda: nnx.split(transformer.create(cfg, seed=seed))[1],
    out_shardings=shardings,
  )
  return graphdef, create()


def _optimizer_shardings(tx, params, param_shardings, mesh):
  """Abstract ``tx.init(params)`` and its shardings: moments sharded like
  the parameters, scalars (step counts) replicated over the whole mesh."""
  shapes = jax.eval_shape(tx.init, params)
  shardings = optax.tree_map_params(
    tx,
    lambda _, s: s,
    shapes,
    param_shardings,
    transform_non_params=lambda _: sharding.replicated(mesh),
  )
  return shapes, shardings


def _optimizer_state(tx, params, mesh):
  """``tx.init(params)``, committed to its shardings (so the state a step
  returns matches the one it was given, and nothing recompiles)."""
  _, shardings = _optimizer_shardings(
    tx, params, jax.tree.map(lambda x: x.sharding, params), mesh
  )
  return jax.jit(tx.init, out_shardings=shardings)(params)


def init_state(setup: Setup) -> tuple[TrainState, Any, Any, Any, Any]:
  """A fresh train state, the graph definitions and the optimizers."""
  o, seed = setup.config.optim, setup.config.seed
  policy_def, policy_params = _parameters(setup, False, seed)
  policy_tx = _optimizer(o.lr, o)
  critic_def = critic_params = critic_tx = critic_opt = None
  if setup.algo.uses_critic:
    critic_def, critic_params = _parameters(setup, True, seed + 1)
    critic_tx = _optimizer(o.critic_lr, o)
    critic_opt = _optimizer_state(critic_tx, critic_params, setup.mesh)
  reference = (
    jax.tree.map(jnp.copy, policy_params) if setup.algo.uses_reference else None
  )
  # Scalars (step, key, counters) are replicated over the mesh; creating
  # them inside a jit works the same on one host and on many.
  step, key, nonfinite = jax.jit(
    lambda: (
      jnp.zeros((), jnp.int32),
      jax.random.key(setup.config.seed),
      jnp.zeros((), jnp.int32),
    ),
    out_shardings=sharding.replicated(setup.mesh),
  )()
  state = TrainState(
    step=step,
    policy=policy_params,
    policy_opt=_optimizer_state(policy_tx, policy_params, setup.mesh),
    critic=critic_params,
    critic_opt=critic_opt,
    reference=reference,
    key=key,
    nonfinite=nonfinite,
  )
  return state, policy_def, critic_def, policy_tx, critic_tx


def abstract_state(setup: Setup) -> tuple[TrainState, Any, Any, Any, Any]:
  """``init_state``'s result as ``jax.ShapeDtypeStruct`` with shardings,
  allocating nothing (for ahead-of-time compilation)."""
  o, mesh = setup.config.optim, setup.mesh
  everywhere = sharding.replicated(mesh)
  rules = setup.config.logical_axis_rules

  def params(value_head):
    cfg = setup.model_cfg.replace(value_head=value_head)
    with nnx.use_eager_sharding(False):
      model = nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0)))
    graphdef, abstract = nnx.split(model)
    shardings = sharding.state_shardings(abstract, mesh, rules)
    structs = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract,
      shardings,
    )
    return graphdef, structs, shardings

  def opt(tx, structs, shardings):
    shapes, placed = _optimizer_shardings(tx, structs, shardings, mesh)
    return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      placed,
    )

  policy_def, policy, policy_sh = params(False)
  policy_tx = _optimizer(o.lr, o)
  critic_def = critic = critic_tx = critic_opt = None
  if setup.algo.uses_critic:
    critic_def, critic, critic_sh = params(True)
    critic_tx = _optimizer(o.critic_lr, o)
    critic_opt = opt(critic_tx, critic, critic_sh)
  scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=everywhere)
  key = jax.eval_shape(lambda: jax.random.key(0))
  state = TrainState(
    step=scalar,
    policy=policy,
    policy_opt=opt(policy_tx, policy, policy_sh),
    critic=critic,
    critic_opt=critic_opt,
    reference=policy if setup.algo.uses_reference else None,
    key=jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=everywhere),
    nonfinite=scalar,
  )
  return state, policy_def, critic_def, policy_tx, critic_tx


def _check_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test{jax.process_index()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"workdir {workdir!r} is not writable: {e}") from None


def _evaluator(setup: Setup, policy_def: Any):
  """Jitted held-out rollouts per evaluation env and temperature."""
  c = setup.config
  cfgs = {
    t: dataclasses.replace(
      setup.rollout_cfg,
      env_groups=c.train.eval_groups,
      group_size=1,
      temperature=float(t),
    )
    for t in c.train.eval_temperatures
  }
  runs = {}
  for name, env in setup.eval_envs.items():
    for t, cfg in cfgs.items():
      # Replicated outputs: every host can read the summary and transcript.
      runs[(name, t)] = jax.jit(
        lambda params, codec, key, env=env, cfg=cfg: rollout.rollout(
          nnx.merge(policy_def, params), codec, env, cfg, key
        ),
        out_shardings=sharding.replicated(setup.mesh),
      )
  # Held-out seeds: training steps fold the step into key(seed); evaluation
  # takes a key split from it instead.
  key = sharding.replicate(
    jax.random.key_data(jax.random.split(jax.random.key(c.seed))[1]),
    setup.mesh,
  )
  key = jax.random.wrap_key_data(key)
  codecs = {
    name: sharding.replicate(codec, setup.mesh)
    for name, codec in setup.eval_codecs.items()
  }

  def evaluate_all(params) -> tuple[dict[str, float], dict[str, str]]:
    metrics, transcripts = {}, {}
    for (name, t), run in runs.items():
      traj = run(params, codecs[name], key)
      traj = jax.tree.map(sharding.local_value, traj)
      stats = evaluate.summary(traj, 1)
      suffix = "" if t == c.train.eval_temperatures[0] else f"@t{t:g}"
      for k, v in stats.items():
        if not k.startswith("pass@"):
          metrics[f"{name}/{k}{suffix}"] = float(v)
      if c.train.transcripts:
        transcripts[f"{name}_t{t:g}"] = evaluate.transcript(
          traj, setup.tokenizer, 0
        )
    return metrics, transcripts

  return evaluate_all


def compile_step(setup, state, policy_def, critic_def, policy_tx, critic_tx):
  """The jitted step, with explicit input and output shardings."""
  state_sharding = jax.tree.map(lambda x: x.sharding, state)
  everywhere = sharding.replicated(setup.mesh)
  return jax.jit(
    make_step(
      env=setup.env,
      rollout_cfg=setup.rollout_cfg,
      algo=setup.algo,
      filter_cfg=setup.filter_cfg,
      policy_def=policy_def,
      critic_def=critic_def,
      policy_tx=policy_tx,
      critic_tx=critic_tx,
      mesh=setup.mesh,
    ),
    donate_argnums=0,
    in_shardings=(state_sharding, everywhere),
    out_shardings=(state_sharding, everywhere),
  )


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains for ``config.train.steps`` steps, resuming from ``workdir``.

  Returns:
    The final summary: steps, last metrics, best evaluation success.

  Raises:
    ConfigError: a bad setting or workdir, before anything compiles.
    NonFiniteError: too many consecutive non-finite steps (the last good
      checkpoint is kept).
  """
  setup = build(config)
  _check_workdir(workdir)
  primary = jax.process_index() == 0
  state, policy_def, critic_def, policy_tx, critic_tx = init_state(setup)
  ckpt = checkpoint.Checkpointer(
    os.path.join(os.path.abspath(workdir), "checkpoints"),
    config.train.keep_checkpoints,
  )
  writer = log_lib.MetricWriter(workdir, enabled=primary)
  start = ckpt.latest_step()
  if start is not None:
    state = ckpt.restore(start, state)
    writer.truncate_after(start)
    if primary:
      print(f"resumed from step {start} in {workdir}", flush=True)
  step_fn = compile_step(
    setup, state, policy_def, critic_def, policy_tx, critic_tx
  )
  evaluate_all = _evaluator(setup, policy_def)
  codec = sharding.replicate(setup.codec, setup.mesh)
  total = config.train.steps
  progress = log_lib.Progress(total, enabled=primary)
  transcripts_dir = os.path.join(workdir, "transcripts")
  last: dict[str, float] = {}
  best_eval = 0.0
  t_run = time.perf_counter()
  step = int(sharding.local_value(state.step))
  if step == 0 and config.train.eval_every > 0:
    # The untrained policy's held-out score: the baseline to beat.
    t_eval = time.perf_counter()
    first, _ = evaluate_all(state.policy)
    first["time/eval_s"] = time.perf_counter() - t_eval
    writer.write(0, first)
    if primary:
      print(
        f"untrained: eval success {100 * first['eval/success']:.1f}%",
        flush=True,
      )
  while step < total:
    t0 = time.perf_counter()
    state, metrics = step_fn(state, codec)
    step += 1
    logging_now = step % config.train.log_every == 0 or step == total
    every = config.train.eval_every
    evaluating = every > 0 and (step % every == 0 or step == total)
    if not (logging_now or evaluating):
      continue
    metrics = {k: float(sharding.local_value(v)) for k, v in metrics.items()}
    seconds = time.perf_counter() - t0
    metrics["time/step_s"] = seconds
    metrics["time/tokens_per_s"] = metrics["rollout/generated_tokens"] / seconds
    if evaluating:
      t_eval = time.perf_counter()
      eval_metrics, transcripts = evaluate_all(state.policy)
      metrics.update(eval_metrics)
      metrics["time/eval_s"] = time.perf_counter() - t_eval
      best_eval = max(best_eval, metrics.get("eval/success", 0.0))
      if primary and transcripts:
        os.makedirs(transcripts_dir, exist_ok=True)
        for name, body in transcripts.items():
          path = os.path.join(transcripts_dir, f"step{step:06d}_{name}.txt")
          with open(path, "w") as f:
            f.write(body)
    writer.write(step, metrics)
    progress.update(step, metrics)
    last = metrics
    if metrics["train/nonfinite_streak"] >= config.train.max_nonfinite_steps:
      ckpt.wait()
      good = ckpt.latest_step()
      where = (
        f"the last good checkpoint is step {good} in {workdir}"
        if good is not None
        else "no checkpoint had been saved yet"
      )
      raise NonFiniteError(
        f"stopped at step {step}: {int(metrics['train/nonfinite_streak'])} "
        "consecutive steps with a non-finite loss (their updates were "
        f"skipped); {where}"
      )
    if step % config.train.checkpoint_every == 0 or step == total:
      ckpt.save(step, state)
  ckpt.wait()
  ckpt.close()
  writer.close()
  progress.close()
  summary = {
    "steps": step,
    "seconds": time.perf_counter() - t_run,
    "final": last,
    "best_eval_success": best_eval,
  }
  if primary:
    print(
      f"done: {step} steps in {summary['seconds']:.0f}s; "
      f"final eval success {100 * last.get('eval/success', 0.0):.1f}%, "
      f"best {100 * best_eval:.1f}%; metrics in {writer.path}",
      flush=True,
    )
  return summary


def final_params(workdir: str, config: ml_collections.ConfigDict) -> Any:
  """The policy parameters of the latest checkpoint (for tests and export)."""
  setup = build(config)
  state, *_ = init_state(setup)
  ckpt = checkpoint.Checkpointer(
    os.path.join(os.path.abspath(workdir), "checkpoints"),
    config.train.keep_checkpoints,
  )
  step = ckpt.latest_step()
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {workdir}")
  restored = ckpt.restore(step, state)
  ckpt.close()
  return jax.tree.map(np.asarray, nnx.to_pure_dict(restored.policy))
