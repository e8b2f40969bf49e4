# shellcheck shell=bash
# End a run attempt's whole process group and record its exit code (unless it already has one), end time and
# the reason. Idempotent; prints the recorded exit code.
# An attempt with no directory yet gets a tombstone: its directory made (taking the launch lock that launch.sh
# takes) holding only the exit code, end time and reason, so a launch of it still on its way here (a controller
# killed mid-launch, a box that hung with the command queued) can never start it. After this returns, the attempt
# does not run on this box and never will.
# Arguments: the attempt's directory name, the exit code to record, the reason, the exit code for "no such run"
# (kept for the protocol's shape: a missing attempt is now tombstoned instead).
name=$1
exit_code=$2
reason=$3
RUN_DIR=$RIGSYNC_ROOT/runs/$name
_rs_finish() {
  if [ ! -e "$RUN_DIR/exit_code" ]; then
    printf "%s\n" "$exit_code" >"$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"
  fi
  if [ ! -e "$RUN_DIR/ended_at" ]; then
    date +%s.%N >"$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"
  fi
}
mkdir -p "$RIGSYNC_ROOT/runs" || exit 1
if mkdir "$RUN_DIR" 2>/dev/null; then
  _rs_finish
  printf "%s\n" "never launched here: $reason" >"$RUN_DIR/killed_reason"
  : >"$RUN_DIR/tombstone"
  cat "$RUN_DIR/exit_code"
  exit 0
fi
pid=$(cat "$RUN_DIR/pid" 2>/dev/null)
case "$pid" in "" | *[!0-9]*) pid= ;; esac
if [ -z "$pid" ] && [ ! -e "$RUN_DIR/exit_code" ]; then
  # A launch holds the lock but its wrapper has not written its pid yet: record the end first, then look once
  # more. The wrapper writes its pid before it reads exit_code, so one of the two sees the other.
  _rs_finish
  for _ in $(seq 1 50); do
    [ -s "$RUN_DIR/pid" ] && break
    sleep 0.02
  done
  pid=$(cat "$RUN_DIR/pid" 2>/dev/null)
  case "$pid" in "" | *[!0-9]*) pid= ;; esac
fi
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
_rs_finish
printf "%s\n" "$reason" >"$RUN_DIR/killed_reason"
cat "$RUN_DIR/exit_code"
