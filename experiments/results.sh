#!/usr/bin/env bash
# The training runs behind docs/results.md's studies (the default configs'
# own runs are the README's: docs/data/learning_defaults.json). Each section
# trains its runs, JOBS at a time, then writes its table's JSON into
# docs/data/ (experiments.learning_table --json), which experiments.doc_tables
# renders; a column is named by its run's directory.
#
#   bash experiments/results.sh [RUNS_DIR]            # every section
#   SECTIONS="search bandit" JOBS=1 bash experiments/results.sh
#
# Sections: search (no planner: the random search's warm start),
# rl_alone_frozen_lake and rl_alone_sokoban (no warm start, one setting
# changed a run), bandit, lora (FrozenLake's warm start, then RL training
# rank-16 adapters only, from it), others (the remaining environments'
# default configs, and Countdown with no warm start). The collapse study
# is experiments/study.sh.
set -euo pipefail
runs=${1:-runs/results}
jobs=${JOBS:-2}
sections=${SECTIONS:-search rl_alone_frozen_lake rl_alone_sokoban bandit lora others}
fl="--config=configs/frozen_lake.py"
sok="--config=configs/sokoban.py"
fl_rl="$fl --config.sft.steps=0 --config.optim.lr=1e-3"
sok_rl="$sok --config.sft.steps=0 --config.optim.lr=1e-3"

# One line a run: its directory's name, then its arguments.
section_runs() {
  case $1 in
    search)
      echo "fl-search $fl --config.sft.expert=search"
      echo "sok-search $sok --config.sft.expert=search"
      ;;
    rl_alone_frozen_lake)
      echo "fls-base $fl_rl"
      echo "fls-group16 $fl_rl --config.rollout.env_groups=8 --config.rollout.group_size=16"
      echo "fls-entropy $fl_rl --config.algo.entropy_coef=0.01"
      echo "fls-all-groups $fl_rl --config.filter.value=1.0"
      echo "fls-lr3e-4 $fl --config.sft.steps=0 --config.optim.lr=3e-4"
      echo "fls-warmup $fl_rl --config.optim.warmup_steps=50"
      ;;
    rl_alone_sokoban)
      echo "soks-base $sok_rl"
      echo "soks-gae $sok_rl --config.algo.adv_estimator=gae"
      echo "soks-group8 $sok_rl --config.rollout.env_groups=16 --config.rollout.group_size=8"
      echo "soks-entropy $sok_rl --config.algo.entropy_coef=0.01"
      echo "soks-all-groups $sok_rl --config.filter.value=1.0"
      echo "soks-lr3e-4 $sok --config.sft.steps=0 --config.optim.lr=3e-4"
      echo "soks-warmup $sok_rl --config.optim.warmup_steps=50"
      echo "soks-10-turns $sok_rl --config.rollout.max_turns=10 --config.rollout.max_actions_per_turn=1 --config.rollout.max_context=640"
      ;;
    bandit)
      echo "bandit --config=configs/bandit.py"
      ;;
    lora)
      echo "fl-warm-start $fl --config.train.steps=0"
      echo "fl-lora $fl --config.sft.steps=0 --config.train.init_from=$runs/fl-warm-start --config.model.lora.rank=16 --config.model.lora.alpha=32 --config.optim.lr=1e-3"
      ;;
    others)
      echo "countdown-scratch --config=configs/countdown.py --config.sft.steps=0 --config.optim.lr=1e-3"
      echo "qa --config=configs/qa.py"
      echo "game2048 --config=configs/game2048.py"
      echo "rubiks_cube --config=configs/rubiks_cube.py"
      echo "sudoku --config=configs/sudoku.py"
      echo "gymnasium --config=configs/gymnasium.py"
      ;;
    *)
      echo "unknown section $1; known: search rl_alone_frozen_lake rl_alone_sokoban bandit lora others" >&2
      return 2
      ;;
  esac
}

for section in $sections; do
  section_runs "$section" >/dev/null
done
mkdir -p "$runs"
# The LoRA run starts from the warm start's checkpoint: that one first.
# (Each run's line expands in the inner shell: $0 is the runs' folder.)
# shellcheck disable=SC2016
for section in $sections; do
  section_runs "$section"
done | grep -v '^fl-lora ' | xargs -P "$jobs" -L 1 bash -c \
  'python -m starpo_jax.main --workdir="$0/$1" "${@:2}" >"$0/$1.log" 2>&1' \
  "$runs"
if [[ " $sections " == *" lora "* ]]; then
  # shellcheck disable=SC2016
  section_runs lora | grep '^fl-lora ' | xargs -L 1 bash -c \
    'python -m starpo_jax.main --workdir="$0/$1" "${@:2}" >"$0/$1.log" 2>&1' \
    "$runs"
fi
for section in $sections; do
  dirs=$(section_runs "$section" | awk -v r="$runs" '{print r "/" $1}')
  # The Bandit's held-out seeds with its training arm names (its eval/
  # plays arm names no training step shows the tiny model).
  evaluation="eval"
  [[ $section == bandit ]] && evaluation=eval_train_env
  # shellcheck disable=SC2086
  python -m experiments.learning_table $dirs --evaluation "$evaluation" \
    --json "docs/data/learning_$section.json"
done
