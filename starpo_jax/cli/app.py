"""What the commands share: ``--help`` (or ``-h``) prints the command's
usage and its flags and exits 0 (absl's own exits 1); a setting that
cannot work (``ConfigError``) prints its message, not a traceback, and
exits 2; libtpu starts quietly on a machine without TPU chips
(``quiet_libtpu``)."""

from __future__ import annotations

import glob
import os
import pathlib
import sys
from collections.abc import Callable, Sequence

from absl import app, flags

from starpo_jax.run.assembly import ConfigError

HELP = ("--help", "-h", "--helpshort")


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
    except ConfigError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(checked)
