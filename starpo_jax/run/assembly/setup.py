"""``build``: a run's ``Setup`` from its config, everything checked on the
host before anything compiles: the environments, the tokenizer, the
model's architecture, the codecs and the mesh."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import envs
from starpo_jax import sharding
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import mixture
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.agent import rollout as rollout_lib
from starpo_jax.algo import sft
from starpo_jax.algo.experts import Replies
from starpo_jax.models import checkpoints
from starpo_jax.models import tokenizer as tokenizer_lib
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.presets import ModelSettings
from starpo_jax.run.assembly.config import ConfigError, parse
from starpo_jax.run.sections import EnvConfig, RunConfig


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything a run is made of, built and checked on the host: its
  config, and what the config resolves to."""

  config: RunConfig
  env: envs.BatchEnv | mixture.Mixture
  eval_envs: dict[str, envs.BatchEnv]
  tokenizer: tokenizer_lib.Tokenizer
  model_cfg: ModelConfig
  # The weights' checkpoint: model.ckpt, or the file of a packaged preset
  # (checkpoints.PACKAGED); "" for random weights.
  ckpt: str
  codec: codec_lib.Codec | mixture.MixedCodec
  eval_codecs: dict[str, codec_lib.Codec]
  mesh: Any
  # Each evaluation environment's registered name and settings
  # (``eval_settings``), by the name evaluation reports it under.
  eval_settings: dict[str, dict[str, Any]]


def build(config: Any, shapes_only: bool = False, devices: Any = None) -> Setup:
  """Parses the config (a ``ConfigDict`` or a ``RunConfig``), checks it and
  builds environments, tokenizer and codecs.

  With ``shapes_only`` (the compile check), a preset without a checkpoint
  or tokenizer gets the compact tokenizer: token ids change, shapes do not.
  ``devices`` (default: all) make the mesh.
  """
  run = parse(config)
  env, eval_envs = _environments(run.env)
  _check_shapes(run, env)
  prompt = run.rollout.prompt_settings()
  ckpt = _checkpoint(run.model)
  tok = _tokenizer(
    run.model, ckpt, [*_parts(env), *eval_envs.values()], prompt, shapes_only
  )
  # Python environments tokenize their observations on the host; on a
  # mesh, each process steps the episodes of its own batch shards.
  bind = lambda e: e.bind(tok.encode, sharding.BATCH)
  env, eval_envs = bind(env), {n: bind(e) for n, e in eval_envs.items()}
  model_cfg = _model_config(run, ckpt, tok)
  codec_of = lambda e: codec_lib.Codec.build(
    tok, e.spec, prompt, model_cfg.vocab_size, sharding.BATCH
  )
  if isinstance(env, mixture.Mixture):
    codec = mixture.MixedCodec.build(tuple(codec_of(e) for e in _parts(env)))
  else:
    codec = codec_of(env)
  try:
    mesh = sharding.make_mesh(run.mesh.shape, devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _check_warm_start(run, env, tok, codec)
  eval_codecs = {n: codec_of(e) for n, e in eval_envs.items()}
  for c in (*mixture.part_codecs(codec), *eval_codecs.values()):
    try:
      rollout_lib.check_context(c, run.rollout)
    except ValueError as e:
      raise ConfigError(f"config.{e}") from None
  return Setup(
    config=run,
    env=env,
    eval_envs=eval_envs,
    tokenizer=tok,
    model_cfg=model_cfg,
    ckpt=ckpt,
    codec=codec,
    eval_codecs=eval_codecs,
    mesh=mesh,
    eval_settings=eval_settings(run.env),
  )


def _parts(env: Any) -> list[envs.BatchEnv]:
  """The environments the run trains on: a ``Mixture``'s parts, or
  ``env``."""
  if isinstance(env, mixture.Mixture):
    return [p.env for p in env.parts]
  return [env]


def warm_start_replies(tok, env: Any, think: bool) -> Any:
  """The replies the warm start's scripts spell: ``env``'s, or a tuple of
  a ``Mixture``'s parts'."""
  replies = [
    Replies.build(tok, e.spec, think, _thoughts(e)) for e in _parts(env)
  ]
  return tuple(replies) if isinstance(env, mixture.Mixture) else replies[0]


def _thoughts(env: Any) -> tuple[str, ...] | None:
  """The pieces of the reasoning ``env`` writes about its board
  (``env.thoughts``), or None."""
  thoughts = getattr(envs.batched(env).jittable, "thoughts", None)
  return None if thoughts is None else thoughts.pieces


def _check_shapes(run: RunConfig, env: Any) -> None:
  """Raises ConfigError for a batch the minibatches do not divide, a
  mixture whose groups are not the rollout's (or a filter by part without
  one), or tools with no turn to read their results."""
  rollout, algo = run.rollout, run.algo
  if isinstance(env, mixture.Mixture):
    try:
      env.configs(rollout)
    except ValueError as e:
      raise ConfigError(f"config.{e}: set rollout.env_groups") from None
  elif run.filter.by_part:
    raise ConfigError(
      "config.filter.by_part ranks each part of env.mixture apart; this "
      f"run plays one environment ({run.env.name})"
    )
  if rollout.batch % algo.minibatches:
    raise ConfigError(
      f"config.algo.minibatches={algo.minibatches} must divide the "
      f"{rollout.batch} episodes (rollout.env_groups x rollout.group_size)"
    )
  tools = [t for e in _parts(env) for t in e.spec.tools]
  if tools and rollout.max_turns < 2:
    raise ConfigError(
      f"config.env.kwargs.tools={','.join(tools)!r}: a tool's "
      "result comes back in the next turn, so rollout.max_turns="
      f"{rollout.max_turns} leaves no turn to read it; set it to 2 or more"
    )


def _check_warm_start(run: RunConfig, env, tok, codec) -> None:
  """Raises ConfigError for a warm start that cannot work here."""
  if not run.sft.steps:
    return
  try:
    parts = sft.warm_parts(
      env,
      warm_start_replies(tok, env, run.rollout.enable_think),
      sft.episodes_config(run.rollout, run.sft, codec),
    )
    for part, replies, cfg in parts:
      sft.check(
        part,
        cfg,
        replies,
        run.sft.expert,
        run.sft.reasoning_tokens,
        run.sft.reasoning,
      )
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None


_TAG = re.compile(r"[a-z][a-z0-9_]*")


def _environments(c: EnvConfig) -> tuple[Any, dict[str, Any]]:
  """The training environment and the evaluation ones by name
  (``eval_settings``). With ``env.mixture``, a ``Mixture``, evaluated part
  by part under each part's tag."""
  if c.mixture:
    env = _mixture(c)
    eval_envs = {p.tag: p.env for p in env.parts}
  else:
    try:
      env = envs.batched(envs.make(c.name, **c.kwargs))
    except ValueError as e:
      field = "kwargs" if c.name in envs.REGISTRY else "name"
      raise ConfigError(f"config.env.{field}: {e}") from None
    eval_envs = {}
  for tag, settings in eval_settings(c).items():
    if tag in eval_envs:
      continue
    if tag == "eval_train_env":
      eval_envs[tag] = env
      continue
    where = (
      "config.env.eval_kwargs"
      if tag == "eval"
      else f"config.env.eval_variants.{tag}"
    )
    kwargs = dict(settings)
    name = kwargs.pop("env")
    try:
      eval_envs[tag] = envs.batched(envs.make(name, **kwargs))
    except ValueError as e:
      raise ConfigError(f"{where}: {e}") from None
  return env, eval_envs


def eval_settings(c: EnvConfig) -> dict[str, dict[str, Any]]:
  """Each evaluation environment by the name evaluation reports it under,
  as its registered name (``env``) and settings: ``eval`` with
  ``env.eval_kwargs`` applied, when those change anything the training
  environment again as ``eval_train_env`` (a mixture: each part by its
  tag), then each of ``env.eval_variants`` by its tag."""
  if c.mixture:
    out = {
      tag: {k: v for k, v in entry.items() if k != "groups"}
      for tag, entry in c.mixture.items()
    }
  else:
    out = {"eval": {"env": c.name, **c.kwargs, **c.eval_kwargs}}
    if c.eval_kwargs:
      out["eval_train_env"] = {"env": c.name, **c.kwargs}
  for tag, overrides in c.eval_variants.items():
    where = f"config.env.eval_variants.{tag}"
    _check_tag(tag, where, out)
    if not isinstance(overrides, Mapping):
      raise ConfigError(
        f"{where}={overrides!r}; expected a mapping of the variant's settings"
      )
    overrides = dict(overrides)
    name = overrides.pop("env", c.name)
    base = {}
    if name == c.name and not c.mixture:
      base = {**c.kwargs, **c.eval_kwargs}
    out[tag] = {"env": name, **base, **overrides}
  return out


def _check_tag(tag: str, where: str, taken: Any) -> None:
  if not _TAG.fullmatch(tag) or tag in taken or tag == "eval":
    raise ConfigError(
      f"{where}: a tag is lower-case letters, digits and underscores, "
      f"and not one of {sorted({'eval', *taken})}"
    )


def _mixture(c: EnvConfig) -> mixture.Mixture:
  """``env.mixture``'s parts, each built by ``envs.make``."""
  if c.kwargs or c.eval_kwargs:
    raise ConfigError(
      "config.env.mixture: each part carries its own settings; "
      "env.kwargs and env.eval_kwargs must be empty"
    )
  parts = []
  for tag, entry in c.mixture.items():
    where = f"config.env.mixture.{tag}"
    _check_tag(tag, where, [p.tag for p in parts])
    kwargs = dict(entry)
    name, groups = kwargs.pop("env", None), kwargs.pop("groups", None)
    if not isinstance(name, str) or not isinstance(groups, int) or groups < 1:
      raise ConfigError(
        f"{where}: needs env (a registered name) and groups (an int >= 1), "
        f"got env={name!r}, groups={groups!r}"
      )
    try:
      env = envs.batched(envs.make(name, **kwargs))
    except ValueError as e:
      raise ConfigError(f"{where}: {e}") from None
    parts.append(mixture.Part(tag, env, groups))
  return mixture.Mixture(tuple(parts))


@contextlib.contextmanager
def as_config_error(setting: str = "config.model") -> Iterator[None]:
  """A checkpoint or tokenizer that cannot be read is a setting that
  cannot work: its error (naming the file) as ``ConfigError`` naming
  ``setting``."""
  try:
    yield
  except (checkpoints.CheckpointError, tokenizer_lib.TokenizerError) as e:
    raise ConfigError(f"{setting}: {e}") from None


def _checkpoint(m: ModelSettings) -> str:
  """``model.ckpt``, else a packaged preset's file, else ""."""
  name = m.ckpt or (m.preset if m.preset in checkpoints.PACKAGED else "")
  if not name:
    return ""
  with as_config_error("config.model.ckpt" if m.ckpt else "config.model"):
    return checkpoints.resolve(name)


def _tokenizer(
  m: ModelSettings,
  ckpt: str,
  all_envs: list[Any],
  prompt: prompt_lib.PromptSettings,
  shapes_only: bool,
) -> tokenizer_lib.Tokenizer:
  """The checkpoint's (or ``model.tokenizer``'s) tokenizer; for the tiny
  model (or a compile check) the compact one over the prompts' pieces."""
  tok_path = m.tokenizer or ckpt
  if tok_path:
    field = "tokenizer" if m.tokenizer else "ckpt"
    with as_config_error(f"config.model.{field}"):
      return checkpoints.tokenizer(tok_path)
  if m.preset == "tiny" or shapes_only:
    pieces = []
    for e in all_envs:
      pieces += prompt_lib.prompt_pieces(e.spec, prompt)
    return tokenizer_lib.build_compact(pieces)
  raise ConfigError(
    f"config.model: preset {m.preset!r} needs model.ckpt or model.tokenizer"
  )


def _model_config(
  run: RunConfig, ckpt: str, tok: tokenizer_lib.Tokenizer
) -> ModelConfig:
  """The checkpoint's architecture, the tiny shape of ``config.model``, or
  a preset's, with the run's dtypes, remat, attention kernel and
  adapters."""
  checkpoint = None
  if ckpt:
    with as_config_error("config.model.ckpt"):
      checkpoint = checkpoints.read_config(ckpt)
  try:
    model_cfg = run.model.architecture(checkpoint, tok.vocab_size)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if model_cfg.vocab_size < tok.vocab_size:
    raise ConfigError(
      f"config.model: the tokenizer has {tok.vocab_size} tokens, more than "
      f"the model's vocab_size={model_cfg.vocab_size}"
    )
  if model_cfg.lora is not None and run.sft.steps:
    raise ConfigError(
      f"config.model.lora.rank={model_cfg.lora.rank}: the warm start "
      f"(config.sft.steps={run.sft.steps}) trains the whole model; run it "
      "without adapters, then start the LoRA run from it with "
      "config.train.init_from"
    )
  return model_cfg
