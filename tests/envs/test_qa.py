"""The QA environment: datasets read through tensorflow-datasets from files
the tests write (nothing is downloaded), errors that name the bad file,
and rewards against the plain-Python rules (``reference/qa.py``)."""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

import envs
from envs.jax.qa import constants, dataset
from reference import qa as ref
from tests.helpers import assert_compiles_once

WIDTH = 48  # bytes an answer may take in these tests


def metamath_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
  """MetaMathQA-style rows; answers of mixed case, some with the marker
  twice, a few GSM8K-style."""
  rng = random.Random(seed)
  rows = []
  for i in range(n):
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    answer = rng.choice([str(a + b), f"x = {a}", f"Blue{b}", "\\frac{1}{2}"])
    work = f"Add {a} and {b}."
    if i % 7 == 0:
      work += " The answer is: not this one."
    response = (
      f"{work}\n#### {answer}"
      if i % 5 == 0
      else f"{work} The answer is: {answer}"
    )
    rows.append({"query": f"Q{i}: what is {a} plus {b}?", "response": response})
  return rows


def write_jsonl(path, rows) -> str:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """A 60-question dataset file and a tfds data directory."""
  root = tmp_path_factory.mktemp("qa")
  rows = metamath_rows(60)
  return write_jsonl(root / "math.jsonl", rows), str(root / "tfds"), rows


def pairs(ds: dataset.Dataset) -> collections.Counter:
  return collections.Counter(zip(ds.questions, ds.answers, strict=True))


def test_jsonl_reads_through_tfds_without_tensorflow(data):
  path, data_dir, rows = data
  code = (
    "import sys; from envs.jax.qa import dataset; "
    f"ds = dataset.load({path!r}, data_dir={data_dir!r}); "
    "print(len(ds.questions), 'tensorflow' in sys.modules)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True
  )
  assert out.stdout.split()[-2:] == [str(len(rows)), "False"]
  ds = dataset.load(path, data_dir=data_dir)
  want = collections.Counter(
    (r["query"], ref.label(r["response"])) for r in rows
  )
  assert pairs(ds) == want
  assert "not this one." not in ds.answers


def test_parquet_with_gsm8k_fields_and_split_slices(tmp_path):
  rows = [
    {"question": f"How many {i}?", "answer": f"Count.\n#### {i * 3}"}
    for i in range(40)
  ]
  path = str(tmp_path / "gsm.parquet")
  pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
  data_dir = str(tmp_path / "tfds")
  whole = dataset.load(path, data_dir=data_dir)
  head = dataset.load(path, split="train[:25%]", data_dir=data_dir)
  tail = dataset.load(path, split="train[25%:]", data_dir=data_dir)
  assert len(head.questions) == 10 and len(tail.questions) == 30
  assert pairs(head) + pairs(tail) == pairs(whole)
  assert pairs(whole) == collections.Counter(
    (r["question"], str(int(r["answer"].split()[-1]))) for r in rows
  )


def test_a_changed_file_is_prepared_again(tmp_path):
  path, data_dir = tmp_path / "a.jsonl", str(tmp_path / "tfds")
  write_jsonl(path, [{"question": "one?", "answer": "1"}])
  assert dataset.load(str(path), data_dir=data_dir).answers == ("1",)
  write_jsonl(path, [{"question": "two?", "answer": "2"}])
  assert dataset.load(str(path), data_dir=data_dir).answers == ("2",)


def test_a_catalog_name_loads_through_tfds_builder(tmp_path):
  """A name is looked up with ``tfds.builder``: here a builder this test
  registers, as the catalog's are."""
  import tensorflow_datasets as tfds

  class TinyCatalogQa(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      features = {
        "question": tfds.features.Text(),
        "answer": tfds.features.Text(),
      }
      return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(features)
      )

    def _split_generators(self, dl_manager):
      return {"test": self._generate_examples()}

    def _generate_examples(self):
      for i in range(5):
        yield i, {"question": f"q{i}", "answer": f"so #### {i}"}

  ds = dataset.load("tiny_catalog_qa", split="test", data_dir=str(tmp_path))
  assert sorted(ds.answers) == [str(i) for i in range(5)]
  del TinyCatalogQa


ROW = '{"query": "a", "response": "1"}\n'
BAD_FILES = [
  (None, "does not exist"),
  ("", "has no records"),
  (ROW + '{"query": "b", "resp', "line 2: not JSON"),
  (ROW + "[1, 2]\n", "line 2: want a JSON object"),
  (ROW + "\udcff bad\n", "line 2: not UTF-8 text (byte 0: b'\\xff')"),
  ('{"q": "a", "r": "1"}\n', "none of the fields ['query', 'question']"),
  (ROW + '{"query": "b"}\n', "line 2: no field 'response'"),
  ('{"query": "a", "response": 7}\n', "line 1: field 'response' must be"),
  ('{"query": "a", "response": "The answer is: "}\n', "the answer is empty"),
]


@pytest.mark.parametrize("content, error", BAD_FILES)
def test_bad_dataset_files_are_named(tmp_path, content, error):
  path = tmp_path / "bad.jsonl"
  if content is not None:
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
  with pytest.raises(ValueError, match=r"bad\.jsonl") as e:
    dataset.load(str(path), data_dir=str(tmp_path / "tfds"))
  assert error in str(e.value)


def test_bad_parquet_and_unknown_fields_are_named(tmp_path):
  path = tmp_path / "bad.parquet"
  path.write_bytes(b"PAR1 not really")
  with pytest.raises(ValueError, match=r"bad\.parquet: not a Parquet file"):
    dataset.load(str(path), data_dir=str(tmp_path / "tfds"))
  good = write_jsonl(tmp_path / "g.jsonl", [{"query": "a", "response": "1"}])
  with pytest.raises(ValueError, match="no field 'prompt'"):
    dataset.load(good, question_field="prompt", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="qa: no dataset"):
    envs.make("qa")


def answer_of(text: bytes) -> envs.Answer:
  data = np.zeros(WIDTH, np.int32)
  data[: len(text)] = list(text)
  return envs.Answer(jnp.asarray(data), jnp.asarray(len(text), jnp.int32))


def attempts(rng: random.Random, label: bytes, other: bytes) -> list[bytes]:
  """Two answers: right ones with whitespace and case changed, near
  misses, blanks and another question's answer, at random."""

  def right():
    swap = bytes(
      c ^ 32 if 65 <= (c & ~32) <= 90 and rng.random() < 0.5 else c
      for c in label
    )
    return (
      rng.choice([b"", b" ", b"\n\t"]) + swap + rng.choice([b"", b"  ", b"\n"])
    )

  def wrong():
    return rng.choice(
      [
        label + b"0",
        label[:-1],
        b"0" + label,
        other,
        b" ",
        label.replace(b" ", b""),
        label + b".",
        b"The answer is: " + label,
      ]
    )

  return [right() if rng.random() < 0.45 else wrong() for _ in range(2)]


def test_rewards_match_the_reference_over_two_turns(data):
  path, data_dir, rows = data
  env = envs.make("qa", source=path, data_dir=data_dir, turns=2)
  by_question = {r["query"]: r["response"] for r in rows}
  n = 512
  states, _ = jax.jit(jax.vmap(env.reset))(
    jax.random.split(jax.random.key(0), n)
  )
  rng = random.Random(1)
  labels = [ref.label(r["response"]).encode() for r in rows]
  pieces, counts = jax.vmap(env.render)(states)
  texts, episodes = [], []
  for b in range(n):
    question = envs.to_text(env.spec, pieces[b], counts[b])
    texts.append(by_question[question])
    label = ref.label(texts[-1]).encode()
    episodes.append(attempts(rng, label, rng.choice(labels)))
  step = jax.jit(jax.vmap(env.step))
  got_rewards, got_success = np.zeros((n, 2)), np.zeros((n, 2), bool)
  s = states
  for k in range(2):
    answers = jax.tree.map(
      lambda *xs: jnp.stack(xs), *[answer_of(e[k]) for e in episodes]
    )
    s, ts = step(s, answers)
    got_rewards[:, k], got_success[:, k] = ts.reward, ts.success
    done = np.asarray(ts.done)
    if k == 0:
      first_done = done
  for b in range(n):
    want = ref.rewards(episodes[b], texts[b], turns=2)
    want += [0.0] * (2 - len(want))
    np.testing.assert_allclose(got_rewards[b], want, err_msg=str(episodes[b]))
    assert got_success[b, 1] == (max(want) > 0)
    assert first_done[b] == (want[0] == 1.0)
  # Every kind of outcome occurred: right first, right second, never.
  outcomes = collections.Counter(float(r.sum()) for r in got_rewards)
  assert set(outcomes) == {0.0, 0.5, 1.0}
  assert np.asarray(ts.done).all()


def test_render_shows_the_question_then_rageN_feedback(data):
  path, data_dir, rows = data
  env = envs.make("qa", source=path, data_dir=data_dir, turns=3)
  state, _ = env.reset(jax.random.key(7))
  question = envs.to_text(env.spec, *env.render(state))
  response = {r["query"]: r["response"] for r in rows}[question]
  state, ts = env.step(state, answer_of(b"-1"))
  assert envs.to_text(env.spec, *env.render(state)) == constants.INCORRECT
  assert ts.valid and not ts.done and ts.reward == 0
  state, ts = env.step(state, answer_of(b" \n"))
  assert not ts.valid and ts.reward == 0
  state, ts = env.step(state, answer_of(ref.label(response).upper().encode()))
  assert envs.to_text(env.spec, *env.render(state)) == constants.CORRECT
  assert ts.success and ts.terminated and ts.reward == pytest.approx(0.25)
  state, ts = env.step(state, answer_of(ref.label(response).encode()))
  assert ts.reward == 0 and ts.done


def test_random_play_compiles_once_and_stays_finite(data):
  path, data_dir, rows = data
  env = envs.make("qa", source=path, data_dir=data_dir, turns=2)
  assert env.spec.answer_pieces == tuple(
    sorted(set("".join(ref.label(r["response"]) for r in rows)))
  )
  keys = [jax.random.split(jax.random.key(k), 256) for k in range(2)]
  (states, _), _ = assert_compiles_once(
    jax.vmap(env.reset), (keys[0],), (keys[1],)
  )
  answer = jax.vmap(env.random_answer)
  (_, ts), _ = assert_compiles_once(
    jax.vmap(env.step),
    (states, answer(states, keys[0])),
    (states, answer(states, keys[1])),
  )
  chex.assert_tree_all_finite(ts.reward)
  # A random question's answer is right about as often as two questions
  # share an answer: rarely, not never, in this dataset.
  assert 0 < float(ts.success.mean()) < 0.2
