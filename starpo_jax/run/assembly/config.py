"""The config, parsed once: a config file's ``ConfigDict`` (or a run's
saved ``config.json``) becomes the typed, frozen ``RunConfig`` that is all
the rest of the code reads.

Unknown keys and wrong types are refused by ``ml_collections`` and by each
section's checks (``starpo_jax/settings.py``), each error naming its
setting (``ConfigError``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from starpo_jax import settings
from starpo_jax.run.sections import RunConfig

# The run's config, as JSON, in its workdir.
CONFIG_FILE = "config.json"

# The settings that name files a run reads (its config.json holds them
# absolute: the run can be evaluated from another directory).
PATHS = (
  ("model", "ckpt"),
  ("model", "tokenizer"),
  ("train", "init_from"),
)


class ConfigError(ValueError):
  """A setting that cannot work; the message names it."""


def parse(config: Any) -> RunConfig:
  """``config`` (an ``ml_collections.ConfigDict``, a mapping, or already
  a ``RunConfig``) as a ``RunConfig``; the first bad setting raises
  ``ConfigError`` naming it."""
  if isinstance(config, RunConfig):
    return config
  try:
    return settings.from_mapping(RunConfig, config, "config")
  except ValueError as e:
    raise ConfigError(str(e)) from None


def changed_settings(run: RunConfig) -> list[str]:
  """``section.key=value`` for every setting of ``run`` that differs from
  its default, nested sections flattened, in the order of ``RunConfig``'s
  fields."""
  out = []

  def walk(prefix: str, got: Any, default: Any) -> None:
    if isinstance(got, dict) and isinstance(default, dict) and got:
      for key, value in got.items():
        walk(f"{prefix}.{key}" if prefix else key, value, default.get(key))
    elif got != default:
      out.append(f"{prefix}={got!r}")

  walk("", dataclasses.asdict(run), settings.defaults(RunConfig))
  return out


def to_json(run: RunConfig) -> str:
  """``run`` as the JSON a workdir keeps, the files it reads absolute."""
  out = dataclasses.asdict(run)
  for section, key in PATHS:
    if out[section][key]:
      out[section][key] = os.path.abspath(out[section][key])
  return json.dumps(out, indent=1, sort_keys=True)


def load_config(workdir: str) -> RunConfig:
  """The config a run in ``workdir`` was started with.

  Raises:
    ConfigError: the workdir has no readable config file, or it holds a
      setting that cannot work.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  try:
    with open(path) as f:
      saved = json.load(f)
  except FileNotFoundError:
    raise ConfigError(
      f"{path!r} does not exist: is {workdir!r} a run directory? (pass "
      "--config to evaluate a checkpoint without one)"
    ) from None
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path!r} is not valid JSON: {e}") from None
  # A run saved before a setting existed gets its default (every new
  # setting's default is the behaviour before it).
  return parse(_merged(settings.defaults(RunConfig), saved))


def _merged(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
  """``saved`` over ``defaults``, nested mappings merged key by key."""
  out = dict(defaults)
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(defaults.get(key), dict):
      value = _merged(defaults[key], value)
    out[key] = value
  return out
