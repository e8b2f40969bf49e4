# shellcheck shell=bash
# The run wrapper: launch.sh writes one copy per attempt into its run directory and starts it detached. It
# records pid, start time and a heartbeat, runs the command in the code directory with the run's environment,
# kills it past its max runtime, records end time and exit code, then starts its slot's next queued attempt.
# Arguments: the run directory, the code commit ('' runs in $HOME), the metrics file (relative to the run
# directory unless absolute), run id, attempt, CUDA_VISIBLE_DEVICES, max runtime in whole seconds (0: none),
# heartbeat interval in seconds, the command.
# Stdin: the job's environment as NUL-ended NAME=VALUE records (from launch.sh); read into memory, then stdin is
# closed. Only the command's own process exports them: not this wrapper, not its heartbeat, not a file.
job_env=()
while IFS= read -r -d '' record; do job_env+=("$record"); done
exec </dev/null
RUN_DIR=$1
commit=$2
metrics_file=$3
run_id=$4
attempt=$5
gpus=$6
max_s=$7
heartbeat_s=$8
command=$9
cd "$RUN_DIR" || exit 1
# Its start tick first, then its pid: launch.sh reads the tick here when a short command has already ended.
{ _rs_stat_field "$$" 22 >pid_start.tmp && mv -f pid_start.tmp pid_start; } || rm -f pid_start.tmp
printf "%s\n" "$$" >pid.tmp && mv -f pid.tmp pid
# Killed before it started (kill.sh records the end, then looks for this pid): do not start the command.
[ -e exit_code ] && exit 0
date +%s.%N >started_at.tmp && mv -f started_at.tmp started_at
: >heartbeat
case $metrics_file in
  /*) ;;
  *) metrics_file=$RUN_DIR/$metrics_file ;;
esac
if [ -n "$commit" ]; then code_dir=$RIGSYNC_ROOT/code/$commit; else code_dir=$HOME; fi
export RIGSYNC_RUN_DIR="$RUN_DIR"
export RIGSYNC_CODE_DIR="$code_dir"
RIGSYNC_PYTHON=$(_rs_best_python) || RIGSYNC_PYTHON=python3
export RIGSYNC_PYTHON
export RIGSYNC_ATTEMPT="$attempt"
export RIGSYNC_RUN_ID="$run_id"
export RIGSYNC_METRICS_FILE="$metrics_file"
if [ -d "$RUN_DIR/resume" ]; then export RIGSYNC_RESUME_DIR="$RUN_DIR/resume"; fi
export CUDA_VISIBLE_DEVICES="$gpus"
if cd "$RIGSYNC_CODE_DIR"; then
  (
    for record in "${job_env[@]}"; do export "${record?}"; done # a builtin: no value becomes an argument
    exec bash -c "$command"
  ) >"$RUN_DIR/stdout.log" 2>"$RUN_DIR/stderr.log" </dev/null &
  CMD=$!
else
  echo "rigsync: code directory $RIGSYNC_CODE_DIR is missing" >"$RUN_DIR/stderr.log"
  CMD=
fi
# The wrapper leads its own session (launch.sh's setsid), so its process group is its pid and the command's
# processes are members of it. Only then are the members ended one by one; otherwise only the command itself.
if [ "$(_rs_stat_field "$$" 5)" = "$$" ]; then own_group=1; else own_group=; fi
_rs_end_command() {
  if [ -n "$own_group" ]; then
    _rs_end_members "$$" "$$" "$BASHPID"
  else
    kill -TERM "$CMD" 2>/dev/null
    sleep 3
    kill -KILL "$CMD" 2>/dev/null
  fi
}
# The heartbeat loop is also the box-side max-runtime guard: it still fires if the reconciler is down. And it ends
# the command once someone else recorded the attempt's end (kill.sh writes exit_code first; a tombstone too): a
# kill without the recorded pid signals nothing itself.
(
  start=$(date +%s)
  while :; do
    touch "$RUN_DIR/heartbeat"
    if [ -n "$CMD" ] && { [ -e "$RUN_DIR/exit_code" ] || [ -e "$RUN_DIR/tombstone" ]; }; then
      _rs_end_command
      break
    fi
    if [ "$max_s" -gt 0 ] && [ -n "$CMD" ] && [ $(($(date +%s) - start)) -ge "$max_s" ]; then
      echo "max_runtime_s $max_s exceeded" >"$RUN_DIR/killed_reason"
      _rs_end_command
      break
    fi
    sleep "$heartbeat_s"
  done
) >/dev/null 2>&1 </dev/null &
HB=$!
if [ -n "$CMD" ]; then
  wait "$CMD"
  code=$?
else
  code=127
fi
kill "$HB" 2>/dev/null
# Ended by someone else or by the runtime guard: what the command left behind in this group goes too.
if [ -n "$own_group" ] && { [ -e "$RUN_DIR/exit_code" ] || [ -e "$RUN_DIR/killed_reason" ]; }; then
  _rs_end_members "$$" "$$"
fi
touch "$RUN_DIR/heartbeat"
# ended_at before the exit code (a probe that sees one sees both); a kill without the recorded pid (kill.sh) waits
# for it as the sign that the command is over, so it is the last write of a killed attempt's wrapper.
date +%s.%N >"$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"
if [ ! -e "$RUN_DIR/exit_code" ]; then
  printf "%s\n" "$code" >"$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"
fi
# The slot is free now: the box starts the next attempt queued for it (dequeue.sh, installed by enqueue.sh).
slot=$(head -c 256 "$RUN_DIR/slot" 2>/dev/null)
if [ -n "$slot" ] && [ -f "$RIGSYNC_ROOT/bin/dequeue.sh" ] && [ -d "$RIGSYNC_ROOT/queue/$slot" ]; then
  bash "$RIGSYNC_ROOT/bin/dequeue.sh" "$slot" </dev/null >/dev/null 2>&1
fi
