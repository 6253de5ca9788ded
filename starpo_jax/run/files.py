"""Files a run writes and reads back: whole files replaced atomically, and
JSON lines whose last line a kill may have cut short.

A file written with ``write_atomically`` is either its old contents or its
new ones, whatever stops the process (a kill, a full disk): the text goes
to a temporary file beside it, is flushed to the disk, and replaces the
file in one rename. Appended JSON lines (``metrics.jsonl``) cannot be
written that way; ``read_json_lines`` drops a last line left without its
newline (the write a kill interrupted) and names the file and line of any
other line that is not JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomically(path: str, text: str) -> None:
  """Replaces ``path``'s contents with ``text`` all at once; on any error
  the file keeps its old contents and no temporary file is left."""
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(
    dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
  )
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_json_lines(path: str) -> list[dict[str, Any]]:
  """The records of a JSON-lines file, blank lines skipped and a cut-short
  last line dropped.

  Raises:
    ValueError: naming the file and line of a line that is not a JSON
      object (other than a cut-short last one).
  """
  with open(path) as f:
    lines = f.read().split("\n")
  out = []
  # Every record is written with its newline: text after the last one is
  # a write that did not finish, and is dropped.
  for number, line in enumerate(lines[:-1], 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{number}: not a JSON object: {line[:80]!r}")
    out.append(record)
  return out
