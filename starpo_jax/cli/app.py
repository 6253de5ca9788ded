"""What the commands share: ``--help`` (or ``-h``) prints the command's
usage and its flags and exits 0 (absl's own exits 1); a mistake on the
command line (an unknown flag or setting, a config file that is not
there, an unknown preset, a setting that cannot work) prints one line
naming it, with the nearest valid name, and exits 2 before anything is
written (``--debug``, or ``STARPO_DEBUG=1``, shows the traceback
instead); libtpu starts quietly on a machine without TPU chips
(``quiet_libtpu``)."""

from __future__ import annotations

import glob
import os
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import app, flags

from starpo_jax import settings
from starpo_jax.run.assembly import ConfigError

HELP = ("--help", "-h", "--helpshort")
DEBUG = "--debug"
DEBUG_ENV = "STARPO_DEBUG"
# Exit status of a command-line mistake (as argparse's).
USAGE_STATUS = 2


# PCI vendor id of Google's devices (TPU chips among them).
_GOOGLE_PCI_VENDOR = "0x1ae0"


def quiet_libtpu() -> None:
  """libtpu, installed with the test requirements to compile for TPU
  topologies on any machine, starts when JAX first picks its backends and,
  on a machine without TPU chips, prints errors about
  TPU_WORKER_HOSTNAMES and the accelerator type before JAX falls back to
  the CPU or GPU. Where no Google PCI device is attached, these two
  settings (unless already set) let it start quietly; a TPU VM is left as
  it is. Call before JAX's first computation."""
  vendors = glob.glob("/sys/bus/pci/devices/*/vendor")
  if any(
    pathlib.Path(v).read_text().strip() == _GOOGLE_PCI_VENDOR for v in vendors
  ):
    return
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")


def wants_help(argv: Sequence[str]) -> bool:
  return any(a in HELP for a in argv[1:])


def debugging(argv: Sequence[str]) -> bool:
  """Whether a mistake shows its traceback: ``--debug`` among ``argv``
  or ``STARPO_DEBUG`` set (to anything but ``0``)."""
  return DEBUG in argv or os.environ.get(DEBUG_ENV, "0") not in ("", "0")


def refuse(message: str, command: str = "") -> NoReturn:
  """Exits with ``USAGE_STATUS`` after one line: ``error: message``
  (``command: message`` where ``command`` is given)."""
  print(
    f"{command}: {message}" if command else f"error: {message}", file=sys.stderr
  )
  sys.exit(USAGE_STATUS)


def config_file_mistake(argv: Sequence[str]) -> str | None:
  """What is wrong with the ``--config`` file ``argv`` names (None:
  nothing, or no ``--config``): a path that is not a file, with the
  nearest file beside it."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg.split("=", 1)[1]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    path = pathlib.Path(value.split(":", 1)[0])
    if path.is_file():
      return None
    where = path.parent if path.parent.is_dir() else pathlib.Path("configs")
    known = sorted(str(p) for p in where.glob("*.py") if p.name[0] != "_")
    return f"--config={value}: no file {str(path)!r}" + settings.nearest(
      str(path), known
    )
  return None


# absl's refusal of a flag's value: "flag --name=value: why".
_FLAG = re.compile(r"flag (--[^=\s]+=\S*): ")
# ml_collections' refusal of a field a locked config does not have.
_NO_FIELD = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"\?')


def flag_mistake(error: BaseException, argv: Sequence[str]) -> str:
  """One line saying which part of ``argv`` ``error`` (raised while the
  flags were parsed) refuses: the innermost of its chained causes, or,
  for a mistyped ``--config.`` setting, the flag and its nearest name."""
  chain = [error]
  while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None:
    chain.append(inner)
  for e in chain:
    m = _NO_FIELD.search(str(e))
    if m is None:
      continue
    right, wrong = m.groups()
    for arg in argv:
      name = arg.split("=", 1)[0]
      if name.startswith("--config.") and name.split(".")[-1] == wrong:
        fixed = ".".join([*name.split(".")[:-1], right])
        return f"{name}: no such setting (did you mean {fixed!r}?)"
    return f"no setting {wrong!r} (did you mean {right!r}?)"
  lines = str(chain[-1]).strip().strip("'\"").splitlines()
  inner = lines[0] if lines else type(chain[-1]).__name__
  for arg in argv:
    name = arg.split("=", 1)[0]
    if name.startswith("--config.") and name.split(".")[-1] == inner:
      # An open section (env.kwargs) without the key: the command line
      # overrides what a config sets, it adds nothing.
      section = ".".join(name.split(".")[1:-1])
      return (
        f"{name}: the config sets no {section}.{inner} to override; set it "
        "in the config file"
      )
  flag = _FLAG.match(str(chain[0]))
  if len(chain) == 1 or flag is None:
    return inner
  return f"{flag.group(1)}: {inner}"


def parse_flags(
  flag_values: flags.FlagValues, argv: Sequence[str], command: str = ""
) -> list[str]:
  """``flag_values(argv)`` with ``--debug`` left out; a mistake exits
  with one line (``refuse``, naming ``command``) unless
  ``debugging(argv)``."""
  plain = [a for a in argv if a != DEBUG]
  try:
    mistake = config_file_mistake(plain[1:])
    if mistake is not None:
      raise ConfigError(mistake)
    return flag_values(plain)
  except Exception as e:
    if debugging(argv):
      raise
    refuse(flag_mistake(e, plain), command)


def run(
  main: Callable[[list[str]], None], required: Sequence[str], doc: str
) -> None:
  """``absl.app.run(main)`` with ``required`` flags; ``doc`` (the
  command's module docstring) is its usage, whichever module started it
  (``python -m starpo_jax.main`` or an installed script)."""
  sys.modules["__main__"].__doc__ = doc
  quiet_libtpu()
  if wants_help(sys.argv):
    app.usage(shorthelp=True, writeto_stdout=True)
    sys.exit(0)
  flags.mark_flags_as_required(list(required))

  def checked(argv: list[str]) -> None:
    try:
      main(argv)
    except (ConfigError, app.UsageError) as e:
      if debugging(sys.argv):
        raise
      refuse(str(e))

  app.run(checked, flags_parser=lambda argv: parse_flags(flags.FLAGS, argv))
