#!/usr/bin/env bash
# RAGEN's study at CPU scale: StarPO against StarPO-S and GRPO, the tiny
# model trained from scratch (no warm start) on FrozenLake and Sokoban with
# the same budget, seeds and learning rate, the collapse diagnostics every
# 5 steps, JOBS runs at a time. Then per environment the report's figures
# (OUT_DIR/ENV) and the table's JSON (docs/data/study_ENV.json, rendered in
# docs/results.md, "The collapse study").
#
#   bash experiments/study.sh [RUNS_DIR [OUT_DIR]]   # JOBS=2 by default
set -euo pipefail
runs=${1:-runs/study}
out=${2:-docs/study}
export STEPS=${STEPS:-100}
jobs=${JOBS:-2}
mkdir -p "$runs"
# Each run's line expands in the inner shell: $0 is the runs' folder.
# shellcheck disable=SC2016
for env in frozen_lake sokoban; do
  for algo in starpo starpo_s grpo; do
    echo "$env $algo"
  done
done | xargs -P "$jobs" -L 1 bash -c \
  'python -m starpo_jax.main --config="configs/$1.py:algo=$2" \
    --workdir="$0/$1-$2" \
    --config.sft.steps=0 --config.train.steps="$STEPS" \
    --config.optim.lr=1e-3 --config.optim.critic_lr=1e-3 \
    --config.train.eval_every=25 --config.train.eval_episodes=256 \
    --config.train.eval_temperatures="(0.5,)" \
    --config.diagnostics.collapse_every=5 >"$0/$1-$2.log" 2>&1' "$runs"
for env in frozen_lake sokoban; do
  python -m starpo_jax.report --out="$out/$env" \
    --workdir="$runs/$env-starpo" --workdir="$runs/$env-starpo_s" \
    --workdir="$runs/$env-grpo"
  python -m experiments.study_table "$runs/$env-starpo" "$runs/$env-starpo_s" \
    "$runs/$env-grpo" --json "docs/data/study_$env.json"
done
