"""launch/*.sh and the benchmarks' and experiments' scripts: syntax,
shellcheck, and the commands --dry-run prints."""

from __future__ import annotations

import pathlib
import shlex
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
# lib.sh included, and the benchmarks' and experiments' scripts.
SCRIPTS = sorted(
  path
  for folder in ("launch", "benchmarks", "experiments")
  for path in (ROOT / folder).rglob("*.sh")
  if ".venv" not in path.parts
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


TPU = ["--name", "n", "--zone", "z", "--type", "t"]
FAKE_GCLOUD = """#!/usr/bin/env bash
# Stands in for gcloud: logs each call; the training command's exit
# statuses come one by one from $FAKE/statuses, describe prints $FAKE/state.
echo "$*" >> "$FAKE/calls"
case "$*" in
  *"starpo_jax.main"*)
    status=$(head -n 1 "$FAKE/statuses"); sed -i 1d "$FAKE/statuses"
    exit "$status" ;;
  *describe*) cat "$FAKE/state" ;;
esac
"""


def fake_launch(tmp_path, statuses, state, *flags):
  """tpu.sh run for real against a fake gcloud; its exit status and the
  gcloud calls it made."""
  (tmp_path / "bin").mkdir()
  gcloud = tmp_path / "bin" / "gcloud"
  gcloud.write_text(FAKE_GCLOUD)
  gcloud.chmod(0o755)
  (tmp_path / "statuses").write_text("".join(f"{s}\n" for s in statuses))
  (tmp_path / "state").write_text(state + "\n")
  env = {
    "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
    "FAKE": str(tmp_path),
    "HOME": str(tmp_path),
  }
  out = subprocess.run(
    [
      "bash",
      str(LAUNCH / "tpu.sh"),
      *("--name", "n3", "--zone", "z", "--type", "v5litepod-8", "--spot"),
      *flags,
      *("--", "--config=configs/bandit.py", "--workdir=/shared/w"),
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  calls = (tmp_path / "calls").read_text().splitlines()
  return out, [c.split()[3] for c in calls if c.startswith("compute tpus")]


def test_tpu_retries_relaunch_a_preempted_run(tmp_path):
  # Stopped by its SIGTERM (75), then preempted under it (255 from ssh,
  # the slice PREEMPTED), then done: three slices, the same command.
  out, calls = fake_launch(
    tmp_path, [75, 255, 0], "PREEMPTED", "--retries", "2"
  )
  assert out.returncode == 0, out.stderr
  runs = ["create", "scp", "ssh", "ssh", "describe", "delete"]
  assert calls == runs * 2 + runs[:5] + ["delete"]
  assert "relaunch 2 of 2" in out.stdout


@pytest.mark.parametrize(
  "statuses,state,want",
  [
    ([1], "READY", 1),  # a failure, not a preemption: no relaunch
    ([75, 75], "READY", 75),  # retries spent
  ],
)
def test_tpu_retries_stop(tmp_path, statuses, state, want):
  out, calls = fake_launch(tmp_path, statuses, state, "--retries", "1")
  assert out.returncode == want
  assert calls.count("create") == len(statuses)


def test_tpu_dry_run_shows_the_relaunch_loop():
  args = [*TPU, "--spot", "--retries", "3", "--", "--config=x"]
  out = subprocess.run(
    ["bash", str(LAUNCH / "tpu.sh"), "--dry-run", *args],
    capture_output=True,
    text=True,
    check=True,
  )
  create = [line for line in out.stdout.splitlines() if " create " in line]
  assert len(create) == 1 and create[0].endswith("--spot")
  loop = [line for line in out.stdout.splitlines() if "at most 3" in line]
  assert len(loop) == 1 and "75" in loop[0] and "describe n " in loop[0]


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
    ("tpu.sh", [*TPU, "--retries", "2", "--", "x"], "needs --spot"),
    ("tpu.sh", [*TPU, "--spot", "--retries", "a", "--", "x"], "a count"),
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
