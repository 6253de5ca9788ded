#!/usr/bin/env bash
# RAGEN's study at CPU scale: StarPO against StarPO-S and GRPO, the tiny
# model trained from scratch (no warm start) on FrozenLake and Sokoban with
# the same budget, seeds and learning rate, the collapse diagnostics every
# 5 steps. Then one report per environment (README, "The collapse study").
#
#   bash benchmarks/study.sh [RUNS_DIR [OUT_DIR]]   # ~1 h on a 2-core CPU
set -euo pipefail
runs=${1:-runs/study}
out=${2:-docs/study}
steps=${STEPS:-100}
for env in frozen_lake sokoban; do
  for algo in starpo starpo_s grpo; do
    python -m starpo_jax.main --config="configs/$env.py:algo=$algo" \
      --workdir="$runs/$env-$algo" \
      --config.sft.steps=0 --config.train.steps="$steps" \
      --config.optim.lr=1e-3 --config.optim.critic_lr=1e-3 \
      --config.train.eval_every=25 --config.train.eval_episodes=256 \
      --config.train.eval_temperatures='(0.5,)' \
      --config.diagnostics.collapse_every=5
  done
  python -m starpo_jax.report --out="$out/$env" \
    --workdir="$runs/$env-starpo" --workdir="$runs/$env-starpo_s" \
    --workdir="$runs/$env-grpo"
done
