"""A new user's typical mistakes on the command line: each gets one line
naming what is wrong (with the nearest valid name where there is one),
exit status 2, no traceback and nothing written; ``--debug`` shows the
traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from starpo_jax.cli import app as cli_app
from starpo_jax.cli import hf as hf_cli


def run(module: str, workdir, *argv: str, debug: bool = False):
  env = dict(os.environ)
  env.pop(cli_app.DEBUG_ENV, None)
  return subprocess.run(
    [
      sys.executable,
      "-m",
      module,
      *argv,
      f"--workdir={workdir}",
      *(["--debug"] if debug else []),
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
  )


@pytest.mark.parametrize(
  "argv, expected",
  [
    # A mistyped setting, its nearest name.
    (
      ["--config=configs/sokoban.py", "--config.rollout.grop_size=8"],
      "--config.rollout.grop_size: no such setting "
      "(did you mean '--config.rollout.group_size'?)",
    ),
    # A key an open section (the environment's arguments) does not set.
    (
      ["--config=configs/frozen_lake.py", "--config.env.kwargs.sise=6"],
      "--config.env.kwargs.sise: the config sets no env.kwargs.sise to "
      "override; set it in the config file",
    ),
    # A config file that is not there, the nearest one beside it.
    (
      ["--config=configs/sokobn.py"],
      "--config=configs/sokobn.py: no file 'configs/sokobn.py' "
      "(did you mean 'configs/sokoban.py'?)",
    ),
    # Presets, config arguments and environments, each its nearest name.
    (
      ["--config=configs/sokoban.py:model=smollm2"],
      "unknown preset 'smollm2' (did you mean 'smollm2-135m'?)",
    ),
    (["--config=configs/sokoban.py:model=gpt5"], "unknown preset 'gpt5';"),
    (
      ["--config=configs/sokoban.py:algo=starpos"],
      "unknown algo preset 'starpos' (did you mean 'starpo_s'?)",
    ),
    (["--config=configs/sokoban.py:algo=ppo2"], "unknown algo preset 'ppo2';"),
    (
      ["--config=configs/sokoban.py:modle=tiny"],
      "unknown config argument 'modle' (did you mean 'model'?)",
    ),
    (
      ["--config=configs/sokoban.py", "--config.env.name=sokobn"],
      "unknown environment 'sokobn' (did you mean 'sokoban'?)",
    ),
    # A context that cannot hold the system prompt and one turn, found
    # before anything compiles.
    (
      ["--config=configs/sokoban.py", "--config.rollout.max_context=58"],
      "config.rollout: max_context=58 is too small: the system prompt "
      "(6 tokens) and one turn (up to 52 + 1 tokens) need 59",
    ),
    # A value of the wrong type, an unknown flag, a stray argument.
    (
      ["--config=configs/sokoban.py", "--config.rollout.group_size=abc"],
      "--config.rollout.group_size=abc: invalid literal for int()",
    ),
    (["--config=configs/sokoban.py", "--wrokdir=x"], "Did you mean: workdir"),
    (["--config=configs/sokoban.py", "extra"], "unexpected arguments"),
    ([], "--config must have a value"),
  ],
)
def test_a_mistake_gets_one_line_and_status_2(tmp_path, argv, expected):
  workdir = tmp_path / "run"
  out = run("starpo_jax.main", workdir, *argv)
  assert out.returncode == 2, out.stderr
  assert "Traceback" not in out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert lines[0].startswith("error: ") and expected in lines[0], lines
  assert not workdir.exists()


def test_debug_shows_the_traceback(tmp_path):
  out = run(
    "starpo_jax.main",
    tmp_path / "run",
    "--config=configs/sokoban.py:model=gpt5",
    debug=True,
  )
  assert out.returncode != 0
  assert "Traceback" in out.stderr and "unknown preset 'gpt5'" in out.stderr


def test_compile_check_refuses_the_same_way(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "starpo_jax.compile_check",
      "--config=configs/bandt.py",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines() == [
    "error: --config=configs/bandt.py: no file 'configs/bandt.py' "
    "(did you mean 'configs/bandit.py'?)"
  ]


@pytest.mark.parametrize(
  "argv, expected",
  [
    (
      ["verify", "smollm2"],
      "nor a packaged preset (did you mean 'smollm2-135m'?)",
    ),
    (["export", "nowhere", "out"], "nowhere: no such file or directory"),
    (["verfy", "x"], "invalid choice: 'verfy'"),
  ],
)
def test_hf_refuses_a_path_or_command_that_is_not_there(capsys, argv, expected):
  with pytest.raises(SystemExit) as exit:
    hf_cli.main(argv)
  err = capsys.readouterr().err
  assert exit.value.code == 2 and expected in err, err
  assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
