# shellcheck shell=bash
# End a run attempt and record its exit code (unless it already has one), end time and the reason. Idempotent;
# prints the recorded exit code.
# A signal goes only to the process group the launch recorded: the controller passes the wrapper's pid and its
# start time (clock ticks since boot, /proc/<pid>/stat field 22) as launch.sh printed them, and the group is
# signalled only while that pid is a number > 1, alive, started at that tick and leads its own session (with the
# wrapper dead, its command's leftovers are: members of that session and group started at or after that tick). A pid
# read back from the run directory is never signalled (a job can write anything there: `1` would be `kill -- -1`).
# The recorded wrapper must also name this attempt's runs/<name>/wrapper.sh on its command line (proc.sh), and its
# leftovers are looked for only once that pid is gone.
# Without a valid recorded identity the end is only recorded: the wrapper's heartbeat sees an exit code it did not
# write and ends its own command; this waits for it while the wrapper shows signs of life.
# An attempt with no directory yet gets a tombstone: its directory made (taking the launch lock that launch.sh
# takes) holding only the exit code, end time and reason, so a launch of it still on its way here (a controller
# killed mid-launch, a box that hung with the command queued) can never start it. After this returns, the attempt
# does not run on this box and never will.
# Arguments: the attempt's directory name, the exit code to record, the reason, the exit code for "no such run"
# (kept for the protocol's shape: a missing attempt is now tombstoned instead), the recorded pid and start time
# ('' when the launch did not say).
name=$1
exit_code=$2
reason=$3
pid=${5:-}
pid_started=${6:-}
RUN_DIR=$RIGSYNC_ROOT/runs/$name
WRAPPER_WAIT_S=15 # the wrapper notices within a heartbeat (2 s) and gives its command 3 s before KILL
_rs_record_code() {
  if [ ! -e "$RUN_DIR/exit_code" ]; then
    printf "%s\n" "$exit_code" >"$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"
  fi
}
_rs_finish() {
  _rs_record_code
  if [ ! -e "$RUN_DIR/ended_at" ]; then
    date +%s.%N >"$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"
  fi
}
_rs_heartbeat_fresh() {
  local t
  t=$(stat -c %Y "$RUN_DIR/heartbeat" 2>/dev/null) || return 1
  case "$t" in '' | *[!0-9]*) return 1 ;; esac
  [ $(($(date +%s) - t)) -le 10 ]
}
mkdir -p "$RIGSYNC_ROOT/runs" || exit 1
if mkdir "$RUN_DIR" 2>/dev/null; then
  _rs_finish
  printf "%s\n" "never launched here: $reason" >"$RUN_DIR/killed_reason"
  : >"$RUN_DIR/tombstone"
  # a queued one: its entry goes too (the tombstone already keeps the dequeue from starting it)
  find "$RIGSYNC_ROOT/queue" -mindepth 2 -maxdepth 2 -name "[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-$name" -exec rm -r {} + 2>/dev/null
  cat "$RUN_DIR/exit_code"
  exit 0
fi
# The end is recorded first: a wrapper that has not started its command yet never does (it reads exit_code after
# it wrote its pid), and a running one ends its command when its heartbeat sees this.
_rs_record_code
if _rs_recorded_group "$pid" "$pid_started" "$RUN_DIR/wrapper.sh"; then
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 30); do
    [ -n "$(_rs_members "$pid")" ] || break
    sleep 0.1
  done
  # While the group has a member its id cannot be given to a new process: it is still the recorded group.
  if [ -n "$(_rs_members "$pid")" ]; then kill -KILL -- "-$pid" 2>/dev/null; fi
  for _ in $(seq 1 20); do
    [ -n "$(_rs_members "$pid")" ] || break
    sleep 0.1
  done
elif ! _rs_alive "$pid" && orphans=$(_rs_orphans "$pid" "$pid_started") && [ -n "$orphans" ]; then
  # The recorded wrapper is gone but its command's processes are not: they are ended one by one.
  # shellcheck disable=SC2086 # one pid a word
  kill -TERM $orphans 2>/dev/null
  for _ in $(seq 1 30); do
    [ -n "$(_rs_orphans "$pid" "$pid_started")" ] || break
    sleep 0.1
  done
  orphans=$(_rs_orphans "$pid" "$pid_started")
  # shellcheck disable=SC2086 # one pid a word
  [ -z "$orphans" ] || kill -KILL $orphans 2>/dev/null
else
  # ended_at is the wrapper's last word; a dead wrapper's heartbeat goes stale, and then nobody is waited for.
  for _ in $(seq 1 $((WRAPPER_WAIT_S * 10))); do
    [ -e "$RUN_DIR/ended_at" ] && break
    _rs_heartbeat_fresh || break
    sleep 0.1
  done
fi
_rs_finish
printf "%s\n" "$reason" >"$RUN_DIR/killed_reason"
cat "$RUN_DIR/exit_code"
