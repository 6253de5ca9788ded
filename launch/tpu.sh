#!/usr/bin/env bash
# Train on a Cloud TPU slice: create it, set up a virtual environment with
# jax[tpu] (once per VM), copy this checkout, run starpo_jax.main on every
# worker, stream the logs, delete the slice. See launch/README.md.
#
#   launch/tpu.sh --name NAME --zone ZONE --type v5litepod-16 \
#     [--project P] [--version RUNTIME] [--queued] [--spot [--retries N]] \
#     [--keep] [--dry-run] -- --config=configs/sokoban.py:model=qwen2.5-3b,...
#
# --retries N: a preempted spot slice (the run exits 75 after its SIGTERM,
# or the slice is PREEMPTED) is deleted, created again and the same run
# resumes from its checkpoint in the (shared) workdir, at most N times.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

name="" zone="" type="" project="" version="tpu-ubuntu2204-base"
queued=0 spot=0 keep=0 dry_run=0 retries=0
jax_spec="jax[tpu]==0.10.2"
remote_dir="starpo-jax"
# shellcheck disable=SC2016 # expanded on the workers
venv='$HOME/starpo-venv'
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --type) type="$2"; shift 2 ;;
    --project) project="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --retries) retries="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "tpu.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
for required in name zone type; do
  if [ -z "${!required}" ]; then
    echo "tpu.sh: --$required is required" >&2
    usage 2
  fi
done
if [ $# -eq 0 ]; then
  echo "tpu.sh: give starpo_jax.main's flags after --" >&2
  usage 2
fi
if ! [[ "$retries" =~ ^[0-9]+$ ]]; then
  echo "tpu.sh: --retries wants a count, not '$retries'" >&2
  usage 2
fi
if [ "$retries" -gt 0 ] && [ "$spot" = 0 ]; then
  echo "tpu.sh: --retries relaunches a preempted slice; it needs --spot" >&2
  usage 2
fi

gcloud_flags=(--zone "$zone")
if [ -n "$project" ]; then
  gcloud_flags+=(--project "$project")
fi
tpu=(gcloud compute tpus tpu-vm)
ssh=("${tpu[@]}" ssh "$name" "${gcloud_flags[@]}" --worker=all)

# The checkout, as git tracks it (committed or not), never the runs.
repo=$(cd "$(dirname "$0")/.." && pwd)
tarball="/tmp/starpo-jax-$name.tar.gz"
if [ "$dry_run" = 1 ]; then
  echo "git -C ${repo@Q} ls-files -z | tar -C ${repo@Q} --null -czf $tarball -T -"
else
  git -C "$repo" ls-files -z | tar -C "$repo" --null -czf "$tarball" -T -
fi

created=0
delete_slice() {
  if [ "$created" = 1 ] && [ "$keep" = 0 ]; then
    if [ "$queued" = 1 ]; then
      run gcloud compute tpus queued-resources delete "$name" \
        "${gcloud_flags[@]}" --force --quiet
    else
      run "${tpu[@]}" delete "$name" "${gcloud_flags[@]}" --quiet
    fi
  fi
  created=0
}
trap delete_slice EXIT

spot_flag=()
if [ "$spot" = 1 ]; then
  spot_flag=(--spot)
fi
create_slice() {
  if [ "$queued" = 1 ]; then
    run gcloud compute tpus queued-resources create "$name" --node-id "$name" \
      "${gcloud_flags[@]}" --accelerator-type "$type" \
      --runtime-version "$version" "${spot_flag[@]}"
    created=1
    if [ "$dry_run" = 1 ]; then
      echo "# wait until the queued resource is ACTIVE"
    else
      until [ "$(gcloud compute tpus queued-resources describe "$name" \
        "${gcloud_flags[@]}" --format='value(state.state)')" = ACTIVE ]; do
        sleep 30
      done
    fi
  else
    run "${tpu[@]}" create "$name" "${gcloud_flags[@]}" \
      --accelerator-type "$type" --version "$version" "${spot_flag[@]}"
    created=1
  fi
}

# The slice's state: PREEMPTED (a TPU VM) or SUSPENDED (a queued
# resource) once spot capacity was taken back.
if [ "$queued" = 1 ]; then
  describe=(gcloud compute tpus queued-resources describe "$name"
    "${gcloud_flags[@]}" --format='value(state.state)')
else
  describe=("${tpu[@]}" describe "$name" "${gcloud_flags[@]}"
    --format='value(state)')
fi

setup="rm -rf $remote_dir && mkdir -p $remote_dir \
&& tar -xzf /tmp/starpo-jax.tar.gz -C $remote_dir \
&& { test -x $venv/bin/python || { python3 -m venv $venv \
&& $venv/bin/pip install -q -r $remote_dir/requirements.txt '$jax_spec'; }; }"
# Every worker runs the same command; jax.distributed finds its peers.
main_flags=$(printf '%q ' "$@")
main_flags=${main_flags% }
log="runs/$name.log"
remote="cd $remote_dir && $venv/bin/python -m starpo_jax.main --distributed \
$main_flags"

attempt=0
while :; do
  create_slice
  run "${tpu[@]}" scp "$tarball" "$name:/tmp/starpo-jax.tar.gz" \
    "${gcloud_flags[@]}" --worker=all
  run "${ssh[@]}" --command "$setup"
  if [ "$dry_run" = 1 ]; then
    echo "$(show "${ssh[@]}" --command "$remote") 2>&1 | tee -a $log"
    if [ "$retries" -gt 0 ]; then
      echo "# on exit status 75 (stopped by its SIGTERM) or when" \
        "$(show "${describe[@]}") prints PREEMPTED or SUSPENDED: delete the" \
        "slice, then the commands above again (the run resumes from its" \
        "checkpoint), at most $retries times"
    fi
    break
  fi
  mkdir -p runs
  status=0
  "${ssh[@]}" --command "$remote" 2>&1 | tee -a "$log" || status=$?
  state=$("${describe[@]}" 2>/dev/null || true)
  preempted=0
  if [ "$status" = 75 ] || [[ "$state" =~ ^(PREEMPTED|SUSPENDED|SUSPENDING)$ ]]; then
    preempted=1
  fi
  if [ "$preempted" = 0 ] || [ "$attempt" -ge "$retries" ]; then
    exit "$status"
  fi
  attempt=$((attempt + 1))
  echo "tpu.sh: preempted (exit status $status, slice ${state:-gone});" \
    "relaunch $attempt of $retries" | tee -a "$log"
  keep=0 delete_slice
done
