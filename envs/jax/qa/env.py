"""Question answering as a pure, jittable text environment (RAGEN's
MetaMathQA environment, over any question-answer dataset).

The dataset is read once on the host through tensorflow-datasets
(``envs.jax.qa.dataset``): every question becomes one piece of the
environment's piece table, so the codec tokenizes each question once, on
the host, into a device table that ``reset`` samples from inside ``jit``;
the answers become a ``[questions, max_answer_bytes]`` byte table.

An episode is one question and up to ``turns`` answers. An answer is
correct when it equals the dataset's answer (the text after "The answer
is:", or GSM8K's "####") after trimming whitespace and ASCII case folding;
the reward is ``1 / 2**k`` for a correct answer after ``k`` wrong ones
(RAGEN's), else 0. After a wrong answer the observation is RAGEN's
"Incorrect. Please think again."; a correct one ends the episode.

Choices made here: RAGEN also deletes whitespace inside answers
(``"1 000" == "1000"``); this compares trimmed answers exactly, as the
issue asks. ``k`` counts answers given, as RAGEN's ``step_num`` counts
steps; a reply without an answer gives none and costs no turn here (the
rollout does not step the environment for it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core
from envs import tools as tools_lib
from envs.jax import render
from envs.jax.qa import constants, dataset

WHITESPACE = b" \t\n\r\x0b\x0c"


@struct.dataclass
class State:
  question: jax.Array  # [] int32 index into the dataset
  answers: jax.Array  # [] int32 answers given so far
  solved: jax.Array  # [] bool
  key: jax.Array  # unused by the dynamics (they are deterministic)


class QA:
  """Questions from a dataset, answered in up to ``turns`` tries."""

  def __init__(
    self,
    source: str = "",
    split: str = "train",
    question_field: str = "",
    answer_field: str = "",
    data_dir: str = "",
    turns: int = 1,
    tools: str = "",
  ) -> None:
    """Reads the dataset (``envs.jax.qa.dataset.load``) before anything
    compiles.

    Args:
      source: a JSONL or Parquet file, or a tfds dataset name.
      split: the tfds split, slices included (``train[:90%]``).
      question_field, answer_field: the fields read; empty: MetaMathQA's or
        GSM8K's names, whichever the data has.
      data_dir: where tfds keeps prepared data; empty: tfds' default.
      turns: answers an episode allows.
      tools: tools the agent may call before it answers (``envs.tools``),
        comma-separated: ``"calculator"``.
    """
    if not source:
      raise ValueError(
        "qa: no dataset; set source to a JSONL or Parquet file or a "
        "tensorflow-datasets name (configs/qa.py names one)"
      )
    if not isinstance(turns, int) or turns < 1:
      raise ValueError(f"qa: turns must be a positive integer, got {turns!r}")
    data = dataset.load(source, split, question_field, answer_field, data_dir)
    self.turns = turns
    table = render.PieceTable()
    self._correct, self._incorrect = table.add_all(
      [constants.CORRECT, constants.INCORRECT]
    )
    self._questions = table.add_all(data.questions)
    self._labels, self._label_lengths, self._answer_ids, answer_pieces = (
      _answer_tables(data.answers)
    )
    self.num_questions = len(data.answers)
    self.spec = core.EnvSpec(
      name="qa",
      pieces=table.pieces,
      action_names=(),
      instructions=constants.INSTRUCTIONS,
      legend=(),
      list_actions=False,
      max_obs_pieces=1,
      max_steps=turns,
      text_answers=True,
      answer_pieces=answer_pieces,
      tools=tools_lib.names(tools),
    )

  def reset(self, key: jax.Array) -> tuple[State, core.TimeStep]:
    k_question, k_dynamics = jax.random.split(key)
    state = State(
      question=jax.random.randint(k_question, (), 0, self.num_questions),
      answers=jnp.zeros((), jnp.int32),
      solved=jnp.zeros((), bool),
      key=k_dynamics,
    )
    return state, core.TimeStep.first()

  def _matches(self, state: State, answer: core.Answer):
    """Whether the answer is non-blank, and whether, trimmed and case
    folded, it equals the question's answer."""
    data = jnp.asarray(answer.data, jnp.int32)
    n = data.shape[0]
    inside = jnp.arange(n) < answer.length
    text = inside & ~jnp.isin(data, jnp.frombuffer(WHITESPACE, np.uint8))
    given = jnp.any(text)
    start = jnp.argmax(text)
    end = n - jnp.argmax(text[::-1])
    width = self._labels.shape[1]
    window = data[jnp.minimum(start + jnp.arange(width), n - 1)]
    window = jnp.where((window >= 65) & (window <= 90), window + 32, window)
    label = jnp.asarray(self._labels)[state.question]
    label_length = jnp.asarray(self._label_lengths)[state.question]
    same = jnp.where(jnp.arange(width) < label_length, window == label, True)
    return given, given & (end - start == label_length) & jnp.all(same)

  def step(
    self, state: State, answer: core.Answer
  ) -> tuple[State, core.TimeStep]:
    given, correct = self._matches(state, answer)
    act = ~state.solved & (state.answers < self.turns)
    reward = jnp.where(correct, 0.5 ** state.answers.astype(jnp.float32), 0.0)
    new = state.replace(
      answers=state.answers + act, solved=state.solved | (act & correct)
    )
    ts = core.TimeStep(
      reward=jnp.where(act, reward, 0.0).astype(jnp.float32),
      terminated=new.solved,
      truncated=~new.solved & (new.answers >= self.turns),
      success=new.solved,
      valid=given,
      effective=act,
    )
    return new, ts

  def random_answer(self, state: State, key: jax.Array) -> core.Answer:
    """The answer of a random question: well formed, blind to this one."""
    del state
    i = jax.random.randint(key, (), 0, self.num_questions)
    return core.Answer(
      data=jnp.asarray(self._labels, jnp.int32)[i],
      length=jnp.asarray(self._label_lengths)[i],
    )

  def solution(self, state: State) -> jax.Array:
    """The dataset's answer as ids into ``spec.answer_pieces``, ``-1``
    after its end."""
    return jnp.asarray(self._answer_ids)[state.question]

  def render(self, state: State) -> tuple[jax.Array, jax.Array]:
    piece = jnp.where(
      state.solved,
      self._correct,
      jnp.where(
        state.answers > 0,
        self._incorrect,
        jnp.asarray(self._questions)[state.question],
      ),
    )
    return piece.astype(jnp.int32)[None], jnp.ones((), jnp.int32)


def _answer_tables(answers: list[str]):
  """Each answer's lowercase bytes ``[Q, W]`` (zero after its length) and
  their lengths, its characters as ids into the answer alphabet ``[Q, W]``
  (-1 after its end), and that alphabet."""
  labels = [a.encode().lower() for a in answers]
  width = max(len(a) for a in labels)
  label_bytes = np.zeros((len(labels), width), np.uint8)
  for i, a in enumerate(labels):
    label_bytes[i, : len(a)] = np.frombuffer(a, np.uint8)
  lengths = np.asarray([len(a) for a in labels], np.int32)
  alphabet = tuple(sorted(set("".join(answers))))
  piece = {p: i for i, p in enumerate(alphabet)}
  ids = np.full((len(labels), width), -1, np.int32)
  for i, a in enumerate(answers):
    ids[i, : len(a)] = [piece[c] for c in a]
  return label_bytes, lengths, ids, alphabet
