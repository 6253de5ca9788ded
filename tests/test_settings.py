"""The typed config: every section is a dataclass whose annotations say
what each setting may be, checked one way (``starpo_jax/settings.py``)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from typing import Literal, get_args, get_origin, get_type_hints

import pytest

from configs import common, sokoban
from starpo_jax import settings
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.algo import advantages
from starpo_jax.models import attention, lora, presets
from starpo_jax.models import config as model_config
from starpo_jax.run import assembly, sections


def fields():
  """(section name, class, field, annotation) for every setting, nested
  sections included."""

  def walk(name, cls):
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
      hint = hints[f.name]
      if dataclasses.is_dataclass(hint):
        yield from walk(f"{name}.{f.name}", hint)
      yield name, cls, f.name, hint

  for name, cls in sections.SECTIONS.items():
    yield from walk(name, cls)


def bad_value(hint):
  """A value the annotation does not allow."""
  if get_origin(hint) is Literal:
    return "no-such-choice"
  if hint is bool:
    return "yes"
  if hint in (int, float):
    return "many"
  return 3  # str, tuple, dict, a section


@pytest.mark.parametrize(
  "section, cls, name, hint",
  list(fields()),
  ids=lambda x: x if isinstance(x, str) else "",
)
def test_every_setting_refuses_a_value_of_the_wrong_type_or_choice(
  section, cls, name, hint
):
  with pytest.raises(ValueError, match=f"^{section}: {name}="):
    settings.from_mapping(cls, {name: bad_value(hint)}, section)


def test_every_setting_has_a_default_the_section_accepts():
  c = common.base_config()
  typed = assembly.parse(c)
  assert typed == sections.RunConfig()
  for name, cls in sections.SECTIONS.items():
    assert getattr(typed, name) == cls()


def test_unknown_settings_and_sections_are_named():
  with pytest.raises(ValueError, match=r"algo: unknown settings \['lr'\]"):
    settings.from_mapping(sections.SECTIONS["algo"], {"lr": 1.0}, "algo")
  with pytest.raises(ValueError, match=r"train.early_stop: unknown settings"):
    settings.from_mapping(
      sections.TrainConfig, {"early_stop": {"patience": 3}}, "train"
    )
  c = sokoban.get_config(None)
  c.optimizer = {"lr": 1.0}
  with pytest.raises(
    assembly.ConfigError, match=r"config: unknown settings \['optimizer'\]"
  ):
    assembly.parse(c)


def test_a_float_setting_takes_an_int_and_a_tuple_a_json_list():
  got = settings.from_mapping(
    sections.TrainConfig, {"eval_temperatures": [1, 0.5]}, "train"
  )
  assert got.eval_temperatures == (1, 0.5)
  with pytest.raises(ValueError, match="a tuple of float"):
    settings.from_mapping(
      sections.TrainConfig, {"eval_temperatures": [1, "x"]}, "train"
    )


def choices(cls, name):
  return set(get_args(get_type_hints(cls)[name]))


def test_the_choices_are_what_the_code_implements():
  algo = sections.SECTIONS["algo"]
  assert choices(algo, "adv_estimator") == set(advantages.ESTIMATORS)
  model = presets.ModelSettings
  assert choices(model, "preset") == set(presets.PRESETS)
  assert choices(model, "attention") == set(attention.IMPLEMENTATIONS)
  assert choices(model, "dtype") == set(model_config.DTYPES)
  assert choices(model, "remat") == set(model_config.REMAT_POLICIES)
  assert choices(model_config.LoraConfig, "quantize") == {"", *lora.QTYPES}
  rollout = sections.SECTIONS["rollout"]
  assert choices(rollout, "prompt") == set(prompt_lib.PROMPT_STYLES)


def test_no_section_leaves_a_setting_untyped():
  for section, _, name, hint in fields():
    assert hint is not typing.Any, f"{section}.{name}"


def test_a_run_saved_before_a_setting_existed_loads_with_its_default(
  tmp_path,
):
  c = sokoban.get_config(None).to_dict()
  del c["model"]["lora"], c["train"]["profile"], c["algo"]["length_buckets"]
  (tmp_path / assembly.CONFIG_FILE).write_text(json.dumps(c))
  loaded = assembly.load_config(str(tmp_path))
  assert loaded.model.lora.rank == 0 and loaded.train.profile == ""
  assert loaded.algo.length_buckets == 4
  assert loaded.rollout.max_context == 320  # what it saved stays


# Every bound the sections' comments and errors document, written out from
# them (not read from the code): (section, setting, the limit, one past it).
# Integers step by one; a float's "one past" is the next float beyond it.
def _past(limit, direction):
  if isinstance(limit, int):
    return limit + direction
  return math.nextafter(limit, direction * math.inf)


_AT_LEAST_1 = {
  "rollout": (
    "chunks env_groups group_size max_turns max_actions_per_turn "
    "max_actions_per_traj max_new_tokens max_context context_turns"
  ),
  "algo": "epochs minibatches logits_chunk length_buckets",
  "sft": "episodes max_turns search_tries",
  "diagnostics": "buckets",
  "train": "log_every checkpoint_every keep_checkpoints",
  "train.early_stop": "baseline_steps",
}
_AT_LEAST_0 = {
  "rollout": "decode_shrinks",
  "algo": "clip_high entropy_coef kl_coef value_clip micro_batch_tokens",
  "filter": "selection_eps value capacity",
  "sft": "steps warmup_steps reasoning_tokens",
  "diagnostics": "collapse_every gradients_every",
  "optim": "weight_decay warmup_steps",
  "train": "steps eval_episodes max_nonfinite_steps",
  "train.early_stop": "reward_std_patience success_patience empty_patience",
}
_BETWEEN_0_AND_1 = {
  "algo": "gamma lam turn_gamma clip_low",
  "optim": "b1 b2",
  "train.early_stop": "reward_std_fraction min_success",
}


def _bounds():
  out = []

  def add(table, low, high):
    for section, names in table.items():
      hints = get_type_hints(_section_class(section))
      for name in names.split():
        kind = hints[name]
        if low is not None:
          out.append((section, name, kind(low), _past(kind(low), -1)))
        if high is not None:
          out.append((section, name, kind(high), _past(kind(high), 1)))

  add(_AT_LEAST_1, 1, None)
  add(_AT_LEAST_0, 0, None)
  add(_BETWEEN_0_AND_1, 0, 1)
  out.append(("algo", "dual_clip", 1.0, math.nextafter(1.0, 0)))
  # Rates: any positive number, not zero.
  for section, name in [
    ("optim", "lr"),
    ("optim", "critic_lr"),
    ("optim", "grad_clip"),
    ("sft", "lr"),
  ]:
    out.append((section, name, 5e-324, 0.0))
  # Every int setting is held in 32 bits.
  out.append(("train", "steps", settings.INT_LIMIT, settings.INT_LIMIT + 1))
  return out


def _section_class(section: str):
  if section == "train.early_stop":
    return get_type_hints(sections.TrainConfig)["early_stop"]
  return sections.SECTIONS[section]


@pytest.mark.parametrize(
  "section, name, limit, past",
  _bounds(),
  ids=lambda x: x if isinstance(x, str) else repr(x),
)
def test_every_documented_bound_holds_at_its_value_and_not_one_past(
  section, name, limit, past
):
  cls = _section_class(section)
  assert name in {f.name for f in dataclasses.fields(cls)}, (section, name)
  at_limit = cls(**{name: limit})
  assert getattr(at_limit, name) == limit
  with pytest.raises(ValueError, match=rf"{re.escape(section)}: {name}\b"):
    cls(**{name: past})
