# shellcheck shell=bash
# End a run attempt's whole process group and record its exit code (unless it already has one), end time and
# the reason. Idempotent; prints the recorded exit code.
# Arguments: the attempt's directory name, the exit code to record, the reason, the exit code for "no such run".
name=$1
exit_code=$2
reason=$3
missing_exit=$4
RUN_DIR=$RIGSYNC_ROOT/runs/$name
if [ ! -d "$RUN_DIR" ]; then
  echo "no run directory runs/$name on this box" >&2
  exit "$missing_exit"
fi
pid=$(cat "$RUN_DIR/pid" 2>/dev/null)
case "$pid" in "" | *[!0-9]*) pid= ;; esac
if [ -n "$pid" ] && _rs_alive "$pid"; then
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 30); do
    _rs_alive "$pid" || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null
  for _ in $(seq 1 20); do
    _rs_alive "$pid" || break
    sleep 0.1
  done
fi
if [ -n "$pid" ]; then kill -KILL -- "-$pid" 2>/dev/null; fi
if [ ! -e "$RUN_DIR/exit_code" ]; then
  printf "%s\n" "$exit_code" >"$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"
fi
if [ ! -e "$RUN_DIR/ended_at" ]; then
  date +%s.%N >"$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"
fi
printf "%s\n" "$reason" >"$RUN_DIR/killed_reason"
cat "$RUN_DIR/exit_code"
