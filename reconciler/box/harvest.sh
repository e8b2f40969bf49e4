# shellcheck shell=bash
# Pull an attempt's results (or its checkpoint) back: run the harvest program (harvest.py) with the box's best
# Python; it writes a tar stream to stdout. Arguments: the program's text, then its own arguments (see harvest.py).
program=$1
shift
py=$(_rs_best_python) || {
  echo "no python3 on the box: the harvest needs one" >&2
  exit 1
}
exec "$py" -c "$program" "$@"
