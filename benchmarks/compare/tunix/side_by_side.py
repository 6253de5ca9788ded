"""starpo-jax beside Tunix on the iteration workload: Sokoban, GRPO, the
tiny Qwen2 policy, the same groups, group size, turns, reply length,
temperature, minibatches, clip range and optimizer, each framework in its
own process (Tunix in its own environment, ``iteration.py``).

Both sides start from the same warm-started policy: a random policy never
closes its answer, and Tunix's agentic loop has no per-turn reply limit
(a turn runs to the episode's token budget, then the episode ends with no
trainable step), so the JAX side first imitates the planner for
``--sft-steps`` steps and writes that policy; Tunix loads it. Both sample
the whole vocabulary (``rollout.answer_vocab`` off: Tunix's sampler has no
token mask) with stop tokens ``<|im_end|>`` and ``<|endoftext|>``.

  python -m benchmarks.compare.run --suite peers             # this CPU
  python -m benchmarks.compare.tunix.side_by_side --iterations 3   # alone

What each side counts as an iteration: starpo-jax one call of the compiled
step (new levels, rollout, update); Tunix one global step of
``GRPOLearner.train`` (new levels from its dataset, rollout, log-prob
recomputation, update), timed between its requests for the next batch of
levels. Warm-up excluded on both sides: the JAX step's first call
(compile) and Tunix's first iteration; Tunix compiles again whenever a
shape it has not seen comes up, and those compiles are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from benchmarks import common
from benchmarks.compare import rows as rows_lib
from benchmarks.compare import workload
from benchmarks.compare.pytorch import starpo as tb
from benchmarks.compare.tunix import check
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.models import hf
from starpo_jax.run import assembly

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = "Tunix 0.1.7 agentic GRPO"
STOP = ("</answer>", "<|im_end|>", "<|endoftext|>")


# Warm-start steps (on SFT_EPISODES planner episodes each) before the
# timed iterations: enough for the tiny policy to close its answers.
SFT_STEPS = {"smoke": 80, "cpu": 60, "ragen": 60}
SFT_EPISODES = 64


def warm_pair(size: str, workdir: str, sft_steps: int) -> workload.Pair:
  """The iteration workload sampling the whole vocabulary, its policy
  warm-started by ``sft_steps`` planner-imitation steps (fresh optimizer
  moments after) and written to ``pair.model_dir`` for Tunix."""
  pair = workload.Pair(
    "tiny",
    size,
    workdir,
    overrides={
      "rollout.answer_vocab": False,
      "sft.steps": sft_steps,
      "sft.episodes": SFT_EPISODES,
      # The smoke size's 320 tokens leave Tunix's episode budget (the
      # context less the first prompt) no room for a second turn.
      "rollout.max_context": 768,
    },
  )
  pair.state = assembly.init_state(pair.setup, pair.learner)
  if sft_steps:
    sft_step = assembly.compile_sft_step(pair.setup, pair.state, pair.learner)
    for _ in range(sft_steps):
      pair.state, _ = sft_step(pair.state, pair.setup.codec)
    pair.state = pair.state.replace(
      policy_opt=assembly.optimizer_state(
        pair.learner.policy_tx, pair.state.policy, pair.setup.mesh
      )
    )
  hf.save(nnx.merge(pair.policy_def, pair.state.policy), pair.model_dir)
  pair.setup.tokenizer.save(os.path.join(workdir, "tokenizer"))
  return pair


def levels(count: int, per_iteration: int, seed: int) -> list[list[dict]]:
  """``count`` batches of ``per_iteration`` new 6x6 one-box levels from
  gym-sokoban's generator (RAGEN's), as Tunix's dataset entries."""
  rng = random.Random(seed)
  out = []
  for _ in range(count):
    out.append(
      [
        dict(
          walls=sorted(lv.walls),
          targets=sorted(lv.targets),
          boxes=sorted(lv.boxes),
          player=list(lv.player),
          rows=lv.rows,
          cols=lv.cols,
          max_steps=lv.max_steps,
        )
        for lv in tb.sokoban_levels(per_iteration, rng)
      ]
    )
  return out


def spec(pair: workload.Pair, workdir: str, iterations: int) -> dict[str, Any]:
  """What ``iteration.py`` needs, from the JAX side's setup."""
  r, a = pair.setup.config.rollout, pair.setup.config.algo
  o = pair.config.optim
  settings = prompt_lib.PromptSettings(
    enable_think=r.enable_think,
    max_actions_per_turn=r.max_actions_per_turn,
    response_hint=r.max_new_tokens,
    answer_vocab=False,
  )
  if r.enable_think or a.adv_estimator != "grpo" or a.uses_reference:
    raise ValueError("the Tunix side runs GRPO without KL or <think>")
  return dict(
    workdir=workdir,
    checkpoint=pair.model_dir,
    tokenizer=os.path.join(workdir, "tokenizer"),
    system=prompt_lib.system_text(pair.setup.env.spec, settings),
    env_groups=r.env_groups,
    group_size=r.group_size,
    max_turns=r.max_turns,
    max_new_tokens=r.max_new_tokens,
    max_actions_per_turn=r.max_actions_per_turn,
    max_actions_per_traj=r.max_actions_per_traj,
    format_penalty=r.format_penalty,
    temperature=r.temperature,
    minibatches=a.minibatches,
    clip_low=a.clip_low,
    clip_high=a.clip_high,
    lr=o.lr,
    b1=o.b1,
    b2=o.b2,
    weight_decay=o.weight_decay,
    grad_clip=o.grad_clip,
    max_context=r.max_context,
    stop=list(STOP),
    levels=levels(iterations, r.env_groups, seed=0),
  )


def jax_side(pair: workload.Pair, repeats: int) -> dict[str, Any]:
  """The compiled step's iterations/s, generated tokens and mean episode
  return (after one warm-up call)."""
  step = assembly.compile_step(pair.setup, pair.state, pair.learner)
  holder = {"state": pair.state}
  seen: list[dict[str, float]] = []

  def iteration():
    holder["state"], m = step(holder["state"], pair.setup.codec)
    names = ("rollout/generated_tokens", "rollout/return", "rollout/num_turns")
    seen.append({k: float(jax.block_until_ready(m[k])) for k in names})

  with workload.PeakMemory() as mem:
    first, seconds, recompiled = workload.timed(iteration, repeats)
  timed = seen[1:]
  return dict(
    iterations_s=1 / seconds,
    tokens=float(np.mean([m["rollout/generated_tokens"] for m in timed])),
    turns=float(np.mean([m["rollout/num_turns"] for m in timed])),
    episode_return=float(np.mean([m["rollout/return"] for m in timed])),
    compile_s=first - seconds,
    peak_gib=mem.gib,
    recompiled=recompiled,
  )


def tunix_side(payload: dict[str, Any], workdir: str) -> dict[str, Any]:
  """Tunix's iterations/s (median after its first iteration), generated
  tokens per iteration and compiles, from ``iteration.py``."""
  path = os.path.join(workdir, "spec.json")
  out = os.path.join(workdir, "tunix.json")
  with open(path, "w") as f:
    json.dump(payload, f)
  subprocess.run(
    [check.python(), os.path.join(HERE, "iteration.py"), path, out],
    check=True,
    # Tunix on the backend the JAX side ran on, after the JAX side has
    # let go of it (this process only waits).
    env=dict(
      os.environ,
      JAX_PLATFORMS=jax.default_backend(),
      XLA_PYTHON_CLIENT_PREALLOCATE="false",
    ),
  )
  with open(out) as f:
    result = json.load(f)
  timed = result["iterations"][1:]
  episodes = payload["env_groups"] * payload["group_size"]
  return dict(
    iterations_s=1 / statistics.median(i["seconds"] for i in timed),
    tokens=float(np.mean([i["generated_tokens"] for i in timed])),
    turns=float(np.mean([i["replies"] for i in timed])) / episodes,
    episode_return=float(np.mean([i["episode_return"] for i in timed])),
    first_s=result["iterations"][0]["seconds"],
    compiles=int(sum(i["compiles"] for i in timed)),
  )


def measure(
  size: str, workdir: str, repeats: int, sft_steps: int
) -> dict[str, Any]:
  """Both sides: one warm-up iteration, then ``repeats`` timed ones."""
  pair = warm_pair(size, workdir, sft_steps)
  payload = spec(pair, workdir, repeats + 1)
  ours = jax_side(pair, repeats)
  del pair
  theirs = tunix_side(payload, workdir)
  workload = (
    f"tiny Sokoban, {payload['env_groups']}x{payload['group_size']} "
    f"episodes x {payload['max_turns']} turns x "
    f"{payload['max_new_tokens']} tokens, GRPO, after {sft_steps} "
    "warm-start steps"
  )
  return dict(workload=workload, jax=ours, tunix=theirs)


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
  """The peers suite's rows in ``benchmarks.compare.run``'s table: iterations/s
  and generated tokens/s, starpo-jax beside Tunix."""
  ours, theirs = result["jax"], result["tunix"]
  return [
    dict(
      suite="peers",
      workload=result["workload"],
      metric=metric,
      jax=mine,
      baseline=PEER,
      torch=peer,
      ratio=mine / peer,
      compile_s=ours["compile_s"],
      peak_gib=ours["peak_gib"],
      recompiled=ours["recompiled"],
      # Turns, returns and tokens of each side, for the docs to quote.
      sides={"starpo-jax": ours, "tunix": theirs},
    )
    for metric, mine, peer in (
      ("iterations/s", ours["iterations_s"], theirs["iterations_s"]),
      (
        "generated tokens/s",
        ours["iterations_s"] * ours["tokens"],
        theirs["iterations_s"] * theirs["tokens"],
      ),
    )
  ]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--repeats", type=int, default=3, help="timed iterations a side"
  )
  parser.add_argument("--sft-steps", type=int, default=None)
  parser.add_argument("--size", default="cpu", choices=workload.SIZES)
  parser.add_argument("--json", default=None)
  parser.add_argument(
    "--workdir", default=None, help="keep the checkpoint, spec and logs here"
  )
  args = parser.parse_args(argv)
  if not os.path.exists(check.python()):
    print(
      f"no Tunix environment at {check.python()}: see {HERE}/requirements.txt"
    )
    return 2
  if args.sft_steps is None:
    args.sft_steps = SFT_STEPS[args.size]
  start = time.perf_counter()
  if args.workdir:
    os.makedirs(args.workdir, exist_ok=True)
    result = measure(args.size, args.workdir, args.repeats, args.sft_steps)
  else:
    with tempfile.TemporaryDirectory() as workdir:
      result = measure(args.size, workdir, args.repeats, args.sft_steps)
  result["seconds"] = time.perf_counter() - start
  result["machine"] = common.machine()
  print(json.dumps(result, indent=1))
  print(rows_lib.table(rows(result)))
  common.write_json(args.json, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
