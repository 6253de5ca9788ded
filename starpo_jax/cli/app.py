"""What the absl commands share: ``--help`` (or ``-h``) prints the
command's usage and its flags and exits 0 (absl's own exits 1); a setting
that cannot work (``ConfigError``) prints its message, not a traceback,
and exits 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from absl import app, flags

from starpo_jax.run.assembly import ConfigError

HELP = ("--help", "-h", "--helpshort")


def wants_help(argv: Sequence[str]) -> bool:
  return any(a in HELP for a in argv[1:])


def run(main: Callable[[list[str]], None], required: Sequence[str]) -> None:
  """``absl.app.run(main)`` with ``required`` flags."""
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
