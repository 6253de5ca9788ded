# shellcheck shell=bash
# Shared by launch/*.sh (sourced, not run).

# show ARG...: the command as one copy-pasteable line.
show() {
  local out=() a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./=:@,+%-]+$ ]]; then
      out+=("$a")
    else
      out+=("${a@Q}")
    fi
  done
  echo "${out[*]}"
}

# run CMD...: prints the command when dry_run=1, runs it otherwise.
run() {
  if [ "${dry_run:-0}" = 1 ]; then
    show "$@"
  else
    "$@"
  fi
}
