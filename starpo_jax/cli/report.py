"""Plots and one self-contained HTML page for one or several training runs.

  python -m starpo_jax.report --workdir=runs/sokoban
  python -m starpo_jax.report --workdir=runs/starpo --workdir=runs/starpo_s \\
    --out=reports/compare

Reads each run's ``metrics.jsonl`` (and ``transcripts/``, ``early_stop.txt``)
and writes to ``--out`` (default ``WORKDIR/report`` of the first run) one
PNG per panel, the runs overlaid: success, reward, in-group reward std,
entropy, reply length, gradient norm, and the collapse diagnostics (mutual
information between prompts and replies against its bound ``log G``, prompt
retrieval against chance; ``diagnostics.py``), and ``report.html``: the
plots embedded, the final numbers of each run and the latest held-out
transcripts. Training curves are means over the last ``SMOOTH`` steps;
held-out success is drawn with its 95% interval and the random valid
player (dashed).
"""

from __future__ import annotations

import base64
import dataclasses
import glob
import html
import os
import sys
from typing import Any

from absl import flags

from starpo_jax.cli import app as cli_app
from starpo_jax.run import metrics as metrics_lib

# Training panels: the mean of the last SMOOTH steps (one step's 8 or 16
# levels make a noisy rate).
SMOOTH = 10
TRANSCRIPT_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Panel:
  """One plot: ``key`` per run (smoothed unless ``held_out``), with
  ``reference`` (a bound, chance, a baseline) dashed beside it."""

  name: str
  title: str
  key: str
  held_out: bool = False
  reference: str = ""
  unit_range: bool = False


PANELS = (
  Panel("success", "training success", "rollout/success", unit_range=True),
  Panel(
    "eval_success",
    "held-out success (first temperature)",
    "eval/success",
    held_out=True,
    reference="eval/random_success",
    unit_range=True,
  ),
  Panel("reward", "episode return", "rollout/return"),
  Panel("reward_std", "in-group reward std", "rollout/in_group_reward_std"),
  Panel("entropy", "entropy (nats per token)", "rollout/entropy"),
  Panel("response_length", "reply length (tokens)", "rollout/response_length"),
  Panel(
    "think_tokens",
    "reasoning before </think> (tokens, well-formed turns)",
    "rollout/think_tokens",
  ),
  Panel(
    "format_rate",
    "answers in the format",
    "rollout/format_rate",
    unit_range=True,
  ),
  Panel("grad_norm", "gradient norm", "train/grad_norm"),
  Panel(
    "mutual_information",
    "MI(prompt; reply), dashed: log G",
    "collapse/mi",
    held_out=True,
    reference="collapse/mi_bound",
  ),
  Panel(
    "retrieval",
    "prompt retrieval @1, dashed: chance",
    "collapse/retrieval@1",
    held_out=True,
    reference="collapse/retrieval_chance@1",
    unit_range=True,
  ),
)

# The final numbers table: (label, key, percent).
FINAL = (
  ("held-out success", "eval/success", True),
  ("held-out success, greedy", "eval/success@t0", True),
  ("random valid player", "eval/random_success", True),
  ("training success", "rollout/success", True),
  ("valid action rate", "rollout/valid_action_rate", True),
  ("answers in the format", "rollout/format_rate", True),
  ("reasoning tokens a well-formed turn", "rollout/think_tokens", False),
  ("entropy", "rollout/entropy", False),
  ("in-group reward std", "rollout/in_group_reward_std", False),
  ("MI(prompt; reply)", "collapse/mi", False),
  ("retrieval@1", "collapse/retrieval@1", True),
)


@dataclasses.dataclass(frozen=True)
class Run:
  label: str
  workdir: str
  records: list[dict[str, Any]]


def load_run(workdir: str, label: str | None = None) -> Run:
  """A run's metrics.

  Raises:
    ValueError: naming ``workdir`` when it holds no readable metrics.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    raise ValueError(f"{workdir}: no metrics.jsonl (not a training run)")
  try:
    records = metrics_lib.read_metrics(workdir)
  except ValueError as e:
    raise ValueError(f"{path}: not JSON lines ({e})") from None
  if not records:
    raise ValueError(f"{path}: empty (the run logged no step)")
  label = label or os.path.basename(os.path.normpath(workdir))
  return Run(label=label, workdir=workdir, records=records)


def series(
  records: list[dict[str, Any]], key: str
) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in records if key in r]
  return [p[0] for p in points], [p[1] for p in points]


def moving_mean(ys: list[float], n: int) -> list[float]:
  return [
    sum(ys[max(0, i - n + 1) : i + 1]) / min(i + 1, n) for i in range(len(ys))
  ]


def warm_start_end(records: list[dict[str, Any]]) -> int:
  """The last warm-start step (0 without one)."""
  return max((r["step"] for r in records if "sft/loss" in r), default=0)


def draw(ax: Any, panel: Panel, runs: list[Run]) -> bool:
  """Draws ``panel`` for every run on ``ax``; False when no run has it."""
  drawn = False
  for run in runs:
    xs, ys = series(run.records, panel.key)
    if not xs:
      continue
    drawn = True
    if not panel.held_out:
      ys = moving_mean(ys, SMOOTH)
    (line,) = ax.plot(
      xs,
      ys,
      label=run.label,
      marker="o" if panel.held_out else None,
      markersize=3,
    )
    color = line.get_color()
    if panel.key.startswith("eval/success"):
      stem = panel.key.replace("/success", "/success_{}")
      _, lo = series(run.records, stem.format("lo"))
      _, hi = series(run.records, stem.format("hi"))
      if len(lo) == len(xs) == len(hi):
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2)
    if panel.reference:
      _, ref = series(run.records, panel.reference)
      if ref:
        ax.axhline(ref[-1], color=color, linestyle="--", linewidth=1)
    warm = warm_start_end(run.records)
    if warm:
      ax.axvline(warm, color=color, linestyle=":", linewidth=1)
  ax.set_title(panel.title, fontsize=10)
  ax.set_xlabel("step")
  if panel.unit_range:
    ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend(fontsize=7)
  return drawn


def pyplot():
  try:
    import matplotlib
  except ImportError:
    raise SystemExit(
      "report needs matplotlib: python3 -m pip install matplotlib"
    ) from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def plot_panels(
  runs: list[Run], panels: tuple[Panel, ...], out: str
) -> dict[str, str]:
  """One PNG per panel that any run has data for: ``{name: path}``."""
  plt = pyplot()
  os.makedirs(out, exist_ok=True)
  written = {}
  for panel in panels:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    if draw(ax, panel, runs):
      fig.tight_layout()
      path = os.path.join(out, f"{panel.name}.png")
      fig.savefig(path, dpi=100)
      written[panel.name] = path
    plt.close(fig)
  return written


def final_numbers(run: Run) -> dict[str, str]:
  """The table's cells for one run: latest held-out figures, training
  means over the last ``SMOOTH`` steps, the latest collapse diagnostics."""
  cells = {"steps": str(run.records[-1]["step"])}
  for label, key, percent in FINAL:
    _, ys = series(run.records, key)
    if not ys:
      cells[label] = "-"
      continue
    value = ys[-1] if key.startswith(("eval/", "collapse/")) else None
    if value is None:
      tail = ys[-SMOOTH:]
      value = sum(tail) / len(tail)
    text = f"{100 * value:.1f}%" if percent else f"{value:.3f}"
    if key == "eval/success":
      _, lo = series(run.records, "eval/success_lo")
      _, hi = series(run.records, "eval/success_hi")
      if lo and hi:
        text += f" [{100 * lo[-1]:.1f}, {100 * hi[-1]:.1f}]"
    cells[label] = text
  _, elapsed = series(run.records, "time/elapsed_s")
  cells["wall time"] = f"{elapsed[-1] / 60:.1f} min" if elapsed else "-"
  stop = os.path.join(run.workdir, "early_stop.txt")
  if os.path.isfile(stop):
    with open(stop) as f:
      cells["early stop"] = f.read().strip()
  return cells


def latest_transcript(run: Run) -> tuple[str, str] | None:
  """``(file name, text)`` of the run's latest held-out transcript."""
  files = sorted(glob.glob(os.path.join(run.workdir, "transcripts", "*.txt")))
  if not files:
    return None
  with open(files[-1]) as f:
    body = f.read()
  if len(body) > TRANSCRIPT_CHARS:
    body = body[:TRANSCRIPT_CHARS] + "\n[...]"
  return os.path.basename(files[-1]), body


def page(runs: list[Run], images: dict[str, str]) -> str:
  """The HTML page, every image inlined (``data:`` URIs): one file."""
  esc = html.escape
  parts = [
    "<!DOCTYPE html>",
    '<html lang="en"><head><meta charset="utf-8">',
    f"<title>starpo-jax report: {esc(', '.join(r.label for r in runs))}"
    "</title>",
    "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
    "img{width:48%;margin:0.5%}table{border-collapse:collapse}"
    "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}"
    "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}"
    "</style></head><body>",
    "<h1>starpo-jax report</h1>",
    "<p>Runs: "
    + ", ".join(f"<code>{esc(r.label)}</code> ({esc(r.workdir)})" for r in runs)
    + ". Training curves are means over the last "
    f"{SMOOTH} steps; held-out success carries its 95% interval, the "
    "random valid player dashed; a dotted line marks where a warm start "
    "ended.</p>",
    "<h2>Final numbers</h2>",
  ]
  cells = [final_numbers(r) for r in runs]
  rows = list(dict.fromkeys(k for c in cells for k in c))
  parts.append(
    "<table><tr><th></th>"
    + "".join(f"<th>{esc(r.label)}</th>" for r in runs)
    + "</tr>"
  )
  for row in rows:
    parts.append(
      f"<tr><th>{esc(row)}</th>"
      + "".join(f"<td>{esc(c.get(row, '-'))}</td>" for c in cells)
      + "</tr>"
    )
  parts.append("</table><h2>Curves</h2>")
  for name, path in images.items():
    with open(path, "rb") as f:
      data = base64.b64encode(f.read()).decode("ascii")
    parts.append(
      f'<img id="{esc(name)}" alt="{esc(name)}" '
      f'src="data:image/png;base64,{data}">'
    )
  parts.append("<h2>Transcripts</h2>")
  for run in runs:
    found = latest_transcript(run)
    if found is None:
      parts.append(f"<p><code>{esc(run.label)}</code>: no transcripts.</p>")
      continue
    name, body = found
    parts.append(
      f"<h3>{esc(run.label)}: {esc(name)}</h3><pre>{esc(body)}</pre>"
    )
  parts.append("</body></html>")
  return "\n".join(parts)


def report(
  workdirs: list[str], out: str | None = None, labels: list[str] | None = None
) -> dict[str, Any]:
  """Writes the plots and ``report.html``; returns their paths."""
  if not workdirs:
    raise ValueError("no --workdir given")
  labels = labels or [None] * len(workdirs)
  if len(labels) != len(workdirs):
    raise ValueError(f"{len(labels)} labels for {len(workdirs)} workdirs")
  runs = [load_run(w, lab) for w, lab in zip(workdirs, labels, strict=True)]
  names = [r.label for r in runs]
  if len(set(names)) < len(names):
    runs = [dataclasses.replace(r, label=r.workdir) for r in runs]
  out = out or os.path.join(workdirs[0], "report")
  images = plot_panels(runs, PANELS, out)
  path = os.path.join(out, "report.html")
  with open(path, "w") as f:
    f.write(page(runs, images))
  return {"html": path, "images": images}


def main(argv: list[str]) -> None:
  """The command line (``argv[0]`` is the program name)."""
  fv = flags.FlagValues()
  workdirs = flags.DEFINE_multi_string(
    "workdir", None, "A run directory (repeat for several).", flag_values=fv
  )
  labels = flags.DEFINE_multi_string(
    "label", None, "One per --workdir (default: the paths).", flag_values=fv
  )
  out = flags.DEFINE_string(
    "out",
    None,
    "Output directory (default: the first WORKDIR/report).",
    flag_values=fv,
  )
  if cli_app.wants_help(argv):
    print(__doc__)
    print(fv.get_help())
    raise SystemExit(0)
  cli_app.parse_flags(fv, argv, "report")
  if not workdirs.value:
    cli_app.refuse("give at least one --workdir", "report")
  try:
    written = report(workdirs.value, out.value, labels.value)
  except ValueError as e:
    if cli_app.debugging(argv):
      raise
    cli_app.refuse(str(e), "report")
  for path in written["images"].values():
    print(f"wrote {path}")
  print(f"wrote {written['html']}")


def entry() -> None:
  """``starpo-report`` and ``python -m starpo_jax.report``."""
  cli_app.quiet_libtpu()
  main(sys.argv)


if __name__ == "__main__":
  entry()
