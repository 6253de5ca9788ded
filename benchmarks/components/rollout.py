"""Throughput of the compiled multi-turn rollout.

  python -m benchmarks.components.rollout  # tiny and 0.5B shapes
  python -m benchmarks.components.rollout --model tiny --json rollout.json

Default Sokoban setting (RAGEN's): 8 groups x 16 episodes, 5 turns, up to
2 actions per turn and 10 per episode, 100 new tokens per turn, sampling at
temperature 1. Random-weight models rarely close an answer, so they
generate the full token budget every turn: a worst case for decoding. The
0.5B shape runs a smaller batch by default on a CPU (override with
``--episodes`` / ``--turns`` / ``--max-new-tokens``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

import envs
from benchmarks import common
from starpo_jax.agent import codec as codec_lib
from starpo_jax.agent import prompt as prompt_lib
from starpo_jax.agent import rollout
from starpo_jax.models import config as model_config
from starpo_jax.models import presets, transformer
from starpo_jax.models import tokenizer as tokenizer_lib

# (episodes, turns, max new tokens) per model when not given.
DEFAULT_SIZES = {"tiny": (128, 5, 100), "qwen2.5-0.5b": (16, 2, 32)}


def bench(
  model_name: str,
  episodes: int,
  turns: int,
  max_new_tokens: int,
  dtype: str,
  repeats: int,
) -> dict[str, Any]:
  env = envs.make("sokoban")
  group = 16 if episodes % 16 == 0 else 1
  cfg = rollout.RolloutConfig(
    env_groups=episodes // group,
    group_size=group,
    max_turns=turns,
    max_new_tokens=max_new_tokens,
    max_context=1 << 30,  # replaced below once the prompt size is known
  )
  settings = cfg.prompt_settings()
  tok = tokenizer_lib.build_compact(
    prompt_lib.prompt_pieces(env.spec, settings)
  )
  overrides = {"vocab_size": tok.vocab_size} if model_name == "tiny" else {}
  model_cfg = presets.preset(
    model_name, dtype=dtype, param_dtype=dtype, **overrides
  )
  codec = codec_lib.Codec.build(tok, env.spec, settings, model_cfg.vocab_size)
  chunk = codec.turn_chunk_size(turns, cfg.max_actions_per_traj)
  context = len(codec.fragments.system) + turns * (chunk + max_new_tokens)
  cfg = rollout.RolloutConfig(**{**cfg.__dict__, "max_context": context})
  model = transformer.create(model_cfg)
  play = jax.jit(lambda m, c, k: rollout.rollout(m, c, env, cfg, k))
  start = time.perf_counter()
  traj = common.block(play(model, codec, jax.random.key(0)))
  first = time.perf_counter() - start
  times, generated, total = [], [], []
  for i in range(repeats):
    start = time.perf_counter()
    traj = common.block(play(model, codec, jax.random.key(i + 1)))
    times.append(time.perf_counter() - start)
    generated.append(int(np.sum(traj.response_lengths)))
    total.append(int(np.sum(traj.length)))
  seconds = float(np.median(times))
  return {
    "model": model_name,
    "params": model_cfg.num_params(),
    "dtype": dtype,
    "episodes": cfg.batch,
    "turns": turns,
    "max_new_tokens": max_new_tokens,
    "context": context,
    "seconds": seconds,
    "compile_s": first - seconds,
    "generated_tokens": float(np.mean(generated)),
    "tokens_per_s": float(np.mean(generated)) / seconds,
    "context_tokens_per_s": float(np.mean(total)) / seconds,
    "episodes_per_s": cfg.batch / seconds,
  }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--model", default="both", choices=["tiny", "qwen2.5-0.5b", "both"]
  )
  parser.add_argument("--episodes", type=int)
  parser.add_argument("--turns", type=int)
  parser.add_argument("--max-new-tokens", type=int)
  parser.add_argument("--dtype", default="float32", choices=model_config.DTYPES)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  models = ["tiny", "qwen2.5-0.5b"] if args.model == "both" else [args.model]
  print(f"machine: {common.machine()}", flush=True)
  rows = []
  for name in models:
    episodes, turns, new = DEFAULT_SIZES[name]
    rows.append(
      bench(
        name,
        args.episodes or episodes,
        args.turns or turns,
        args.max_new_tokens or new,
        args.dtype,
        args.repeats,
      )
    )
    print(f"  {name}: done", flush=True)
  print(
    common.markdown_table(
      [
        "model",
        "episodes x turns x new tokens",
        "generated tokens/s",
        "episodes/s",
        "s per rollout",
        "compile s",
      ],
      [
        [
          r["model"],
          f"{r['episodes']} x {r['turns']} x {r['max_new_tokens']}",
          r["tokens_per_s"],
          r["episodes_per_s"],
          r["seconds"],
          r["compile_s"],
        ]
        for r in rows
      ],
    )
  )
  common.write_json(args.json, {"machine": common.machine(), "rows": rows})
  return rows


if __name__ == "__main__":
  main()
