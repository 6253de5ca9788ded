"""The report: plots for one run and for several, one self-contained HTML
page that shows them (checked in headless Chromium where installed)."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess

import matplotlib.image
import pytest

from experiments import study_table
from starpo_jax.cli import report

TRANSCRIPT = "turn 1\nuser: #P_O#\nassistant: <answer>Up</answer>\nreward 1.0\n"


def write_run(path, steps=30, success=0.5, collapse_from=None, stop=None):
  """A run's metrics: every step's training metrics, held-out success
  every 10 steps, the collapse diagnostics every 5."""
  path.mkdir(parents=True)
  records = []
  for s in range(1, steps + 1):
    r = {
      "step": s,
      "rollout/success": success * s / steps,
      "rollout/return": success * s / steps - 0.1,
      "rollout/in_group_reward_std": 0.4 - 0.01 * s,
      "rollout/entropy": 1.0 / s,
      "rollout/response_length": 6.0,
      "rollout/valid_action_rate": 0.9,
      "rollout/format_rate": 0.95,
      "rollout/think_tokens": 30.0 - 0.5 * s,
      "train/grad_norm": 0.5,
      "time/elapsed_s": 10.0 * s,
    }
    if s % 10 == 0:
      r.update(
        {
          "eval/success": success,
          "eval/success_lo": success - 0.05,
          "eval/success_hi": success + 0.05,
          "eval/success@t0": success + 0.01,
          "eval/random_success": 0.2,
        }
      )
    if s % 5 == 0:
      mi = math.log(8) / 2 if collapse_from is None or s < collapse_from else 0
      r.update(
        {
          "collapse/mi": mi,
          "collapse/mi_bound": math.log(8),
          "collapse/retrieval@1": 0.5,
          "collapse/retrieval_chance@1": 1 / 8,
        }
      )
    records.append(r)
  (path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in records)
  )
  (path / "transcripts").mkdir()
  (path / "transcripts" / "step000010_eval_t0.5.txt").write_text("old\n")
  (path / "transcripts" / f"step{steps:06d}_eval_t0.5.txt").write_text(
    TRANSCRIPT
  )
  if stop:
    (path / "early_stop.txt").write_text(stop + "\n")
  return path


def read(path) -> str:
  with open(path) as f:
    return f.read()


def read_bytes(path) -> bytes:
  with open(path, "rb") as f:
    return f.read()


PNG = b"\x89PNG\r\n\x1a\n"


def images_in(page: str) -> dict[str, bytes]:
  found = re.findall(
    r'<img id="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"', page
  )
  return {name: base64.b64decode(data) for name, data in found}


def test_one_run_every_panel_drawn_and_inlined(tmp_path):
  run = write_run(tmp_path / "starpo_s")
  out = report.report([str(run)])
  assert out["html"] == str(run / "report" / "report.html")
  assert set(out["images"]) == {p.name for p in report.PANELS}
  page = read(out["html"])
  inlined = images_in(page)
  assert set(inlined) == set(out["images"])
  for name, path in out["images"].items():
    data = read_bytes(path)
    assert data[:8] == PNG and inlined[name] == data
    assert matplotlib.image.imread(path).shape[2] in (3, 4)
  # Nothing is fetched from elsewhere: the page is one file.
  assert not re.search(r'(src|href)="(?!data:)', page)
  assert "55.0% [50.0, 60.0]" not in page  # success 0.5, not 0.55
  assert "50.0% [45.0, 55.0]" in page  # held-out success with its interval
  assert "20.0%" in page  # the random valid player
  # The latest transcript, escaped.
  assert "&lt;answer&gt;Up&lt;/answer&gt;" in page
  assert "<answer>" not in page


def test_two_runs_overlaid_with_their_numbers(tmp_path):
  a = write_run(tmp_path / "a" / "starpo", success=0.3, collapse_from=15)
  b = write_run(tmp_path / "b" / "starpo_s", success=0.6, stop="early stop")
  out = report.report([str(a), str(b)], out=str(tmp_path / "cmp"))
  page = read(out["html"])
  assert "<th>starpo</th><th>starpo_s</th>" in page
  assert "30.0% [25.0, 35.0]" in page and "60.0% [55.0, 65.0]" in page
  assert "<td>-</td><td>early stop</td>" in page
  assert len(images_in(page)) == len(report.PANELS)
  # Same names: the runs are told apart by their paths.
  out = report.report([str(a), str(a)], out=str(tmp_path / "same"))
  assert page.count(str(a)) < read(out["html"]).count(str(a))


def test_a_run_without_some_metrics_draws_what_it_has(tmp_path):
  run = tmp_path / "bare"
  run.mkdir()
  (run / "metrics.jsonl").write_text(
    json.dumps({"step": 1, "rollout/success": 0.1}) + "\n"
  )
  out = report.report([str(run)])
  assert set(out["images"]) == {"success"}
  assert "no transcripts" in read(out["html"])


def test_bad_workdirs_are_named(tmp_path, capsys):
  with pytest.raises(ValueError, match=r"nowhere: no metrics\.jsonl"):
    report.report([str(tmp_path / "nowhere")])
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match="empty"):
    report.report([str(empty)])
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "metrics.jsonl").write_text("{not json\n")
  for argv, pattern in (
    ([f"--workdir={broken}"], r"broken/metrics\.jsonl: not JSON"),
    ([f"--workdir={broken}", f"--workdir={empty}", "--label=x"], "1 labels"),
    ([], "give at least one --workdir"),
    ([f"--workdri={broken}"], "Did you mean: workdir"),
  ):
    with pytest.raises(SystemExit) as exit:
      report.main(["report", *argv])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(f"^report: .*{pattern}", err), err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
  CHROMIUM is None, reason="Debian's chromium package is not installed"
)
def test_every_plot_loads_in_headless_chromium(tmp_path):
  a = write_run(tmp_path / "starpo")
  b = write_run(tmp_path / "starpo_s", success=0.7)
  out = report.report([str(a), str(b)], out=str(tmp_path / "r"))
  # A copy of the page that writes, once loaded, each image's decoded size
  # into the DOM for --dump-dom to print.
  probe = tmp_path / "probe.html"
  probe.write_text(
    read(out["html"]).replace(
      "</body>",
      "<script>window.addEventListener('load', () => {"
      "const p = document.createElement('p'); p.id = 'sizes';"
      "p.textContent = [...document.images].map("
      "i => i.id + ':' + i.naturalWidth + 'x' + i.naturalHeight).join(' ');"
      "document.body.appendChild(p);});</script></body>",
    )
  )
  dom = subprocess.run(
    [
      CHROMIUM,
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--virtual-time-budget=5000",
      "--dump-dom",
      probe.as_uri(),
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  ).stdout
  sizes = re.search(r'<p id="sizes">([^<]*)</p>', dom).group(1).split()
  assert len(sizes) == len(report.PANELS)
  for item in sizes:
    name, size = item.split(":")
    w, h = map(int, size.split("x"))
    assert (w, h) == (500, 340), name  # 5 x 3.4 inches at 100 dpi


def test_the_study_table_reads_first_and_last_values(tmp_path):
  a = write_run(tmp_path / "starpo", success=0.3, collapse_from=15)
  run = report.load_run(str(a))
  text = study_table.table(
    [{"label": run.label, "cells": study_table.column(run)}]
  )
  rows = dict(
    (line.split(" | ")[0].strip("| "), line.split(" | ")[1].strip(" |"))
    for line in text.splitlines()[2:]
  )
  assert rows["final held-out success"] == "30.0% [25.0, 35.0]"
  assert (
    rows["held-out success by step"] == "30.0 / 30.0 / 30.0 (steps 10, 20, 30)"
  )
  # MI log(8)/2 until step 15, then 0.
  assert rows["MI(prompt; reply) nats, first / last"] == "1.040 / 0.000"
  # Training success s * 0.3 / 30: mean over steps 1-10, then 21-30.
  assert rows["training success %, first / last 10"] == "5.5 / 25.5"
