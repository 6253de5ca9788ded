#!/usr/bin/env bash
# Train on GPU nodes under SLURM: one process per GPU through srun, joined
# by jax.distributed (which reads SLURM's variables). Run it on a login
# node (srun allocates) or inside an sbatch/salloc allocation. See
# launch/README.md.
#
#   launch/gpu.sh --nodes 2 --gpus-per-node 8 [--partition P] \
#     [--time 24:00:00] [--account A] [--venv PATH] [--dry-run] \
#     -- --config=configs/sokoban.py:model=qwen2.5-3b,ckpt=...
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

nodes="" gpus="" partition="" time_limit="" account="" dry_run=0
venv="${STARPO_VENV:-.venv}"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --gpus-per-node) gpus="$2"; shift 2 ;;
    --partition) partition="$2"; shift 2 ;;
    --time) time_limit="$2"; shift 2 ;;
    --account) account="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "gpu.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
for n in "$nodes" "$gpus"; do
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu.sh: --nodes and --gpus-per-node take positive integers" >&2
    usage 2
  fi
done
if [ $# -eq 0 ]; then
  echo "gpu.sh: give starpo_jax.main's flags after --" >&2
  usage 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
srun_flags=(
  --nodes "$nodes"
  --ntasks-per-node "$gpus"
  --gpus-per-node "$gpus"
  --cpus-per-task 8
  --kill-on-bad-exit=1
)
if [ -n "$partition" ]; then srun_flags+=(--partition "$partition"); fi
if [ -n "$time_limit" ]; then srun_flags+=(--time "$time_limit"); fi
if [ -n "$account" ]; then srun_flags+=(--account "$account"); fi

# Each task sees only its own GPU; jax.distributed takes the coordinator,
# process count and index from SLURM_* variables.
main_flags=$(printf '%q ' "$@")
task="cd ${repo@Q} && export CUDA_VISIBLE_DEVICES=\$SLURM_LOCALID \
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 && exec ${venv@Q}/bin/python \
-m starpo_jax.main --distributed ${main_flags% }"
cmd=(srun "${srun_flags[@]}" bash -c "$task")
if [ "$dry_run" = 1 ]; then
  show "${cmd[@]}"
else
  "${cmd[@]}"
fi
