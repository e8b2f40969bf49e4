# shellcheck shell=bash
# Functions shared by every script rigsync runs on a box: reconciler/remote/commands.py puts this file in front
# of each one. The command line exports RIGSYNC_ROOT (rigsync's directory on the box) and
# RIGSYNC_PYTHON_CANDIDATES (interpreters to try, colon-separated, most specific first).
: "${RIGSYNC_ROOT:?rigsync: RIGSYNC_ROOT is not set}"

# Alive means "exists and is not a zombie": on a box whose PID 1 does not reap orphans, a finished process
# lingers as a zombie and `kill -0` alone would call it alive forever.
_rs_alive() {
  local state
  [ -n "$1" ] || return 1
  kill -0 "$1" 2>/dev/null || return 1
  state=$(sed -e "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -c1)
  [ "$state" != "Z" ]
}

# Print the path of the first candidate interpreter that actually runs Python 3.
_rs_best_python() {
  local p
  local -a candidates
  IFS=: read -r -a candidates <<<"${RIGSYNC_PYTHON_CANDIDATES:-}"
  for p in "${candidates[@]}"; do
    if "$p" -c "import sys; sys.exit(0 if sys.version_info[0] >= 3 else 1)" >/dev/null 2>&1; then
      command -v "$p" 2>/dev/null || printf "%s\n" "$p"
      return 0
    fi
  done
  return 1
}
