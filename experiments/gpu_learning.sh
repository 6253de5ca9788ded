#!/usr/bin/env bash
# The default Sokoban config (tiny model, warm start, StarPO-S) trained for
# 2,000 RL steps on one GPU; the target is >= 80% held-out success, in
# under 8 minutes on an H200. Writes the run to WORKDIR and its learning
# table to WORKDIR/learning.json.
#
#   bash experiments/gpu_learning.sh [WORKDIR] [--config.x=y ...]
#
# On a machine that reaches no package registry, WHEELS=DIR installs what
# its image lacks (ml-collections, tensorboardX) from wheels brought along.
# Tried on a CPU with a few steps:
#   bash experiments/gpu_learning.sh /tmp/gpu-try --config.sft.steps=2 \
#     --config.train.steps=2 --config.train.eval_episodes=32
set -euo pipefail
cd "$(dirname "$0")/.."
workdir=${1:-runs/sokoban-gpu}
shift || true
if [ -n "${WHEELS:-}" ]; then
  python -m pip install --no-index --find-links "$WHEELS" \
    ml-collections tensorboardX
fi
# Take GPU memory as needed rather than 75% at start.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m starpo_jax.main --config=configs/sokoban.py --workdir="$workdir" \
  --config.train.steps=2000 --config.train.eval_every=250 \
  --config.train.checkpoint_every=500 "$@"
python -m experiments.learning_table "$workdir" --json "$workdir/learning.json"
