"""Question-answer datasets through tensorflow-datasets, read on the host.

``load(source, split, ...)`` returns the questions and their answers as
Python strings. ``source`` is either a local file, JSONL (one JSON object
per line) or Parquet, with a question and an answer field in the style of
MetaMathQA (``query``, ``response``) or GSM8K (``question``, ``answer``),
or the name of a dataset ``tfds.builder`` knows (its catalog, or
``huggingface:<name>`` where the machine can download it).

A local file becomes a tensorflow-datasets dataset (``LocalQA``) prepared
once under ``data_dir`` as ArrayRecord, keyed by the file's SHA-256, so a
changed file is prepared again and split slicing (``train[:90%]``) works as
for any tfds dataset. Reading needs no TensorFlow: ``as_data_source``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator

from envs.jax.qa import constants

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclasses.dataclass(frozen=True)
class Dataset:
  questions: tuple[str, ...]
  answers: tuple[str, ...]  # the answer after the dataset's marker


def extract_answer(text: str) -> str:
  """The text after the last answer marker (``ANSWER_MARKERS``), trimmed;
  the whole text, trimmed, when it has none."""
  for marker in constants.ANSWER_MARKERS:
    if marker in text:
      return text.rsplit(marker, 1)[1].strip()
  return text.strip()


def _digest(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()[:16]


def _rows(path: str) -> Iterator[tuple[str, dict]]:
  """(where, row) per record of a JSONL or Parquet file; errors name the
  file and line."""
  if path.endswith(".parquet"):
    import pyarrow.parquet

    try:
      table = pyarrow.parquet.read_table(path)
    except Exception as e:
      raise ValueError(f"qa: {path}: not a Parquet file ({e})") from None
    for i, row in enumerate(table.to_pylist()):
      yield f"{path}, row {i}", row
    return
  with open(path, "rb") as f:
    for line_no, raw in enumerate(f, 1):
      where = f"{path}, line {line_no}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        bad = raw[e.start : e.start + 1]
        raise ValueError(
          f"qa: {where}: not UTF-8 text (byte {e.start}: {bad!r})"
        ) from None
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"qa: {where}: not JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise ValueError(f"qa: {where}: want a JSON object, got {line[:80]!r}")
      yield where, row


def _field(given: str, candidates: tuple[str, ...], keys, where: str) -> str:
  if given:
    if given not in keys:
      raise ValueError(
        f"qa: {where}: no field {given!r}; it has {sorted(keys)}"
      )
    return given
  for name in candidates:
    if name in keys:
      return name
  raise ValueError(
    f"qa: {where}: none of the fields {list(candidates)}; it has "
    f"{sorted(keys)} (name them with question_field / answer_field)"
  )


@functools.cache
def _local_builder_class():
  """The tfds builder of local files, defined once (tfds registers every
  builder class by name) and only when asked for (tfds imports slowly)."""
  import tensorflow_datasets as tfds

  class LocalQA(tfds.core.GeneratorBasedBuilder):
    """Question-answer pairs of one local JSONL or Parquet file."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, path: str, fields: tuple[str, str], **kwargs):
      self._path, self._fields = path, fields
      super().__init__(**kwargs)

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {"question": tfds.features.Text(), "answer": tfds.features.Text()}
        ),
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, (where, row) in enumerate(_rows(self._path)):
        values = []
        for name in self._fields:
          value = row.get(_field(name, (), row, where))
          if not isinstance(value, str) or not value.strip():
            raise ValueError(
              f"qa: {where}: field {name!r} must be non-empty text, got "
              f"{value!r}"
            )
          values.append(value)
        yield i, dict(zip(("question", "answer"), values, strict=True))

  return LocalQA


def _local_builder(path: str, data_dir: str | None, fields: tuple[str, str]):
  """A tfds builder over one local file, its config named by the fields
  read and the file's digest."""
  import tensorflow_datasets as tfds

  config = tfds.core.BuilderConfig(
    name=f"{fields[0]}-{fields[1]}-{_digest(path)}"
  )
  return _local_builder_class()(
    path=path,
    fields=fields,
    config=config,
    data_dir=data_dir,
    file_format="array_record",
  )


def _builder(source: str, question_field: str, answer_field: str, data_dir):
  """The tfds builder of ``source`` (a local file is wrapped in one) and
  the names of the question and answer fields its records hold."""
  import tensorflow_datasets as tfds

  tfds.disable_progress_bar()
  data_dir = data_dir or None
  if source.endswith(LOCAL_SUFFIXES):
    if not os.path.isfile(source):
      raise ValueError(f"qa: dataset file {source!r} does not exist")
    head = next(_rows(source), None)
    if head is None:
      raise ValueError(f"qa: dataset file {source!r} has no records")
    where, first = head
    fields = (
      _field(question_field, constants.QUESTION_FIELDS, first, where),
      _field(answer_field, constants.ANSWER_FIELDS, first, where),
    )
    return _local_builder(source, data_dir, fields), ("question", "answer")
  builder = tfds.builder(source, data_dir=data_dir, file_format="array_record")
  keys = builder.info.features.keys()
  fields = (
    _field(question_field, constants.QUESTION_FIELDS, keys, source),
    _field(answer_field, constants.ANSWER_FIELDS, keys, source),
  )
  return builder, fields


def load(
  source: str,
  split: str = "train",
  question_field: str = "",
  answer_field: str = "",
  data_dir: str = "",
) -> Dataset:
  """Reads a question-answer dataset through tensorflow-datasets.

  Args:
    source: a ``.jsonl``/``.json``/``.parquet`` file, or a dataset name
      ``tfds.builder`` knows.
    split: a tfds split, slices included (``train[:90%]``).
    question_field, answer_field: the fields to read; empty: the first of
      ``constants.QUESTION_FIELDS`` / ``ANSWER_FIELDS`` the data has.
    data_dir: where tfds keeps prepared data; empty: its default
      (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).

  Raises:
    ValueError: a missing or malformed file, or missing fields, naming the
      file and line; an empty split.
  """
  builder, fields = _builder(source, question_field, answer_field, data_dir)
  builder.download_and_prepare()
  records = builder.as_data_source(split=split)
  text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
  questions, answers = [], []
  for i, record in enumerate(records):
    questions.append(text(record[fields[0]]))
    answers.append(extract_answer(text(record[fields[1]])))
    if not answers[-1]:
      raise ValueError(
        f"qa: {source!r} split {split!r}, record {i}: the answer is empty "
        f"after {list(constants.ANSWER_MARKERS)}"
      )
  if not questions:
    raise ValueError(f"qa: {source!r} split {split!r} is empty")
  return Dataset(questions=tuple(questions), answers=tuple(answers))
