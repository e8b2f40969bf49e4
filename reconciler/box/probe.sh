# shellcheck shell=bash
# Run the probe program with the first candidate interpreter that can; the one that did is reported as the
# box's best Python. Without any, print the probe's error document.
# Arguments: the probe's output format (for that error document), the probe program's text, the controller's lease
# epoch (0: none; the probe raises the box's fence to it).
format=$1
program=$2
IFS=: read -r -a candidates <<<"$RIGSYNC_PYTHON_CANDIDATES"
for p in "${candidates[@]}"; do
  path=$(command -v "$p" 2>/dev/null) || continue
  RS_EPOCH=${3:-0} RS_BEST_PY=$path "$path" -c "$program" 2>/dev/null && exit 0
done
printf '{"v":%d,"box_now":%s,"error":"no python3 on the box: the probe needs one"}\n' "$format" "$(date +%s)"
