"""The config's sections as typed dataclasses, and the one way to check
them.

Every section of the config (``configs/common.py`` builds its defaults
from these classes) is a frozen dataclass whose annotations say what each
setting may be: ``Literal[...]`` for a choice, ``bool``, ``int``,
``float`` (an ``int`` is accepted), ``str``, ``tuple[T, ...]``, ``dict``,
``X | None``, or a nested section. ``check`` tests every field against its
annotation; each section's ``__post_init__`` calls it, then checks its
ranges. ``from_mapping`` builds a section from the config's mapping,
naming settings the section does not have.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args, get_origin, get_type_hints


def nearest(name: str, known: Iterable[str]) -> str:
  """``" (did you mean 'X'?)"`` for the known name closest to a
  mistyped ``name``, or ``""`` when none is close."""
  close = difflib.get_close_matches(name, list(known), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


def choices(cls: type, name: str) -> tuple[Any, ...]:
  """The values a ``Literal`` field of section ``cls`` may take."""
  return get_args(get_type_hints(cls)[name])


def _fits(value: Any, hint: Any) -> bool:
  origin = get_origin(hint)
  if hint is Any:
    return True
  if origin is Literal:
    return value in get_args(hint)
  if origin in (typing.Union, types.UnionType):
    return any(_fits(value, h) for h in get_args(hint))
  if hint is type(None):
    return value is None
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, int | float) and not isinstance(value, bool)
  if hint is str:
    return isinstance(value, str)
  if hint is tuple or origin is tuple:
    # A config read back from JSON holds lists.
    args = [a for a in get_args(hint) if a is not Ellipsis]
    return (
      isinstance(value, tuple | list) and all(_fits(v, args[0]) for v in value)
      if args
      else isinstance(value, tuple | list)
    )
  if hint is dict or origin is dict:
    return isinstance(value, Mapping)
  if dataclasses.is_dataclass(hint):
    return isinstance(value, hint)
  raise TypeError(f"settings: unsupported annotation {hint!r}")


def _expected(hint: Any) -> str:
  if get_origin(hint) is Literal:
    return f"one of {get_args(hint)}"
  if get_origin(hint) in (typing.Union, types.UnionType):
    return " or ".join(_expected(h) for h in get_args(hint))
  if get_origin(hint) is tuple:
    return f"a tuple of {_expected(get_args(hint)[0])}"
  return getattr(hint, "__name__", None) or str(hint)


# Every int setting is a size, a count or a seed that arrays and XLA hold
# in 32 bits.
INT_LIMIT = 2**31 - 1


def _out_of_range(value: Any) -> str | None:
  """Why a number its annotation allows still cannot be a setting."""
  if isinstance(value, float) and not math.isfinite(value):
    return "must be finite"
  is_int = isinstance(value, int) and not isinstance(value, bool)
  if is_int and abs(value) > INT_LIMIT:
    return f"must be at most {INT_LIMIT} in size"
  return None


def check(section: Any, name: str) -> None:
  """Raises ``ValueError`` naming the first field of dataclass ``section``
  (config section ``name``) whose value its annotation does not allow, or
  a number that is not finite or beyond 32 bits."""
  hints = get_type_hints(type(section))
  for field in dataclasses.fields(section):
    value, hint = getattr(section, field.name), hints[field.name]
    if not _fits(value, hint):
      raise ValueError(
        f"{name}: {field.name}={value!r}; expected {_expected(hint)}"
      )
    why = _out_of_range(value)
    if why:
      raise ValueError(f"{name}: {field.name}={value!r} {why}")


def within(section: Any, name: str, **bounds: tuple[Any, Any]) -> None:
  """Raises ``ValueError`` naming the first of ``bounds``' fields of
  ``section`` (config section ``name``) outside its range ``(low, high)``,
  both included; ``None`` leaves that side open."""
  for field, (low, high) in bounds.items():
    value = getattr(section, field)
    if (low is not None and value < low) or (high is not None and value > high):
      if high is None:
        allowed = f">= {low}"
      elif low is None:
        allowed = f"<= {high}"
      else:
        allowed = f"in [{low}, {high}]"
      raise ValueError(f"{name}: {field}={value!r} must be {allowed}")


def from_mapping(cls: type, values: Mapping[str, Any], name: str) -> Any:
  """``cls`` from the config's section ``name``; nested sections from
  nested mappings. A setting ``cls`` does not have, a wrong type or a bad
  value raises ``ValueError`` naming it."""
  if hasattr(values, "to_dict"):  # an ml_collections.ConfigDict
    values = values.to_dict()
  hints = get_type_hints(cls)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ValueError(
      f"{name}: unknown settings {unknown}; known: {sorted(fields)}"
    )
  kwargs = {}
  for key, value in values.items():
    hint = hints[key]
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
      value = from_mapping(hint, value, f"{name}.{key}")
    elif hint is tuple or get_origin(hint) is tuple:
      value = _tuples(value)
    kwargs[key] = value
  try:
    return cls(**kwargs)
  except TypeError as e:
    raise ValueError(f"{name}: {e}") from None


def _tuples(value: Any) -> Any:
  """Lists (as JSON holds tuples) made tuples again, nested ones too."""
  if isinstance(value, list | tuple):
    return tuple(_tuples(v) for v in value)
  return value


def defaults(cls: type) -> dict[str, Any]:
  """Section ``cls``'s settings and their defaults, nested as dicts."""
  return dataclasses.asdict(cls())
