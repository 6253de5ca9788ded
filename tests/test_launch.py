"""launch/*.sh and benchmarks/*.sh: syntax, shellcheck, and the commands
--dry-run prints."""

from __future__ import annotations

import pathlib
import shlex
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "launch"
# lib.sh included, and the benchmarks' scripts.
SCRIPTS = sorted(LAUNCH.glob("*.sh")) + sorted(
  (ROOT / "benchmarks").glob("*.sh")
)


def dry_run(script: str, *args: str) -> list[list[str]]:
  out = subprocess.run(
    ["bash", str(LAUNCH / script), "--dry-run", *args],
    capture_output=True,
    text=True,
    check=True,
    timeout=60,
  )
  # Each printed line is one shell command; parse it as bash would.
  return [
    shlex.split(line, comments=True)
    for line in out.stdout.splitlines()
    if not line.startswith("#")
  ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
  subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
  shellcheck = shutil.which("shellcheck")
  assert shellcheck, "shellcheck is installed by requirements-dev.txt"
  out = subprocess.run(
    [shellcheck, "-x", str(script)], capture_output=True, text=True
  )
  assert out.returncode == 0, out.stdout


def test_tpu_dry_run_creates_runs_and_deletes():
  main = ["--config=configs/sokoban.py:model=qwen2.5-3b", "--workdir=/w x"]
  cmds = dry_run(
    "tpu.sh", "--name", "n1", "--zone", "z1", "--type", "v4-16", "--", *main
  )
  joined = [" ".join(c) for c in cmds]
  assert cmds[1][:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "n1"]
  assert "--accelerator-type v4-16" in joined[1]
  assert any(c[4] == "scp" and "--worker=all" in c for c in cmds[2:])
  ssh = [c for c in cmds if c[4:6] == ["ssh", "n1"]]
  setup, train = (c[c.index("--command") + 1] for c in ssh)
  assert "jax[tpu]" in setup and "test -x" in setup  # venv made once
  # The remote command is itself shell: its words are starpo_jax.main's.
  words = shlex.split(train)
  at = words.index("starpo_jax.main")
  assert words[at + 1 :] == ["--distributed", *main]
  assert "tee" in cmds[-2] and "runs/n1.log" in cmds[-2]
  assert cmds[-1][:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "n1"]


def test_tpu_queued_and_keep():
  cmds = dry_run(
    "tpu.sh",
    *("--name", "n2", "--zone", "z", "--type", "v5litepod-8", "--queued"),
    *("--keep", "--", "--config=configs/bandit.py"),
  )
  assert cmds[1][3:5] == ["queued-resources", "create"]
  assert not any("delete" in c for c in cmds)


def test_gpu_dry_run_one_process_per_gpu():
  (cmd,) = dry_run(
    "gpu.sh",
    *("--nodes", "2", "--gpus-per-node", "8", "--partition", "p"),
    *("--", "--config=configs/sokoban.py", "--config.mesh.shape=(2,8,1)"),
  )
  assert cmd[0] == "srun"
  flags = " ".join(cmd[1:-3])
  assert "--nodes 2" in flags and "--ntasks-per-node 8" in flags
  assert cmd[-3:-1] == ["bash", "-c"]
  words = shlex.split(cmd[-1])
  assert "CUDA_VISIBLE_DEVICES=$SLURM_LOCALID" in words
  at = words.index("starpo_jax.main")
  assert words[at + 1 :] == [
    "--distributed",
    "--config=configs/sokoban.py",
    "--config.mesh.shape=(2,8,1)",
  ]


@pytest.mark.parametrize(
  "script,args,message",
  [
    ("tpu.sh", ["--zone", "z", "--type", "t", "--", "x"], "--name"),
    ("tpu.sh", ["--name", "n", "--zone", "z", "--type", "t"], "after --"),
    ("gpu.sh", ["--nodes", "0", "--gpus-per-node", "8", "--", "x"], "positive"),
    ("tpu.sh", ["--bogus"], "unknown option"),
  ],
)
def test_bad_arguments_are_named(script, args, message):
  out = subprocess.run(
    ["bash", str(LAUNCH / script), "--dry-run", *args],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert out.returncode == 2
  assert message in out.stderr
