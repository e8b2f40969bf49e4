# shellcheck shell=bash
# Launch one run attempt: take the launch lock (an atomic mkdir of the attempt's directory), write meta.json and
# the wrapper, start the wrapper detached in a session of its own, and print its pid and start time as one line
# `PID START`.
# Arguments: the attempt's directory name, the exit code for "lock held", how many job environment records
# stdin holds, the lease epoch it carries (0: none), the exit code for "fenced", the meta.json text, the wrapper's
# text, then the wrapper's own arguments after its first (see wrapper.sh).
# Fencing: the epoch raises the box's fence (queue.sh); one older than the fence is refused before anything is
# written, with the fenced exit code. The dequeue (dequeue.sh) starts a queued attempt through this same script.
# Stdin: that many records of the job's own environment (a sweep's env:, secrets resolved on the controller),
# each NAME=VALUE ended by a NUL byte; with 0, stdin is not read at all. It never travels as an argument (every
# user of the box sees arguments in `ps`) and is never written to a file: it is held in this shell's memory and
# piped to the wrapper, which exports it for the command only. Read before the lock is taken, so a refused record
# leaves nothing behind; no message quotes one.
env_count=$3
case $env_count in
  '' | *[!0-9]*)
    echo "launch: the job environment record count is not a number" >&2
    exit 1
    ;;
esac
job_env=()
while [ "${#job_env[@]}" -lt "$env_count" ]; do
  if ! IFS= read -r -d '' record; then
    echo "launch: stdin ended after ${#job_env[@]} of $env_count job environment records" >&2
    exit 1
  fi
  case ${record%%=*} in
    '' | [!A-Z_]* | *[!A-Z0-9_]*)
      echo "launch: refused a job environment record: its name is not an uppercase variable name" >&2
      exit 1
      ;;
  esac
  if [ "${record#*=}" = "$record" ]; then
    echo "launch: refused a job environment record without '='" >&2
    exit 1
  fi
  job_env+=("$record")
done
name=$1
lock_exit=$2
epoch=$4
fence_exit=$5
meta=$6
wrapper=$7
shift 7
RUN_DIR=$RIGSYNC_ROOT/runs/$name
mkdir -p "$RIGSYNC_ROOT/runs" || exit 1
fence=$(_rs_fence "$epoch")
case $? in
  0) ;;
  1)
    echo "launch refused: epoch $epoch is older than the box's fence $fence" >&2
    exit "$fence_exit"
    ;;
  *)
    echo "launch: cannot read or raise the box's fence (epoch $epoch)" >&2
    exit 1
    ;;
esac
if ! mkdir "$RUN_DIR" 2>/dev/null; then
  echo "launch lock held: run directory runs/$name already exists" >&2
  exit "$lock_exit"
fi
printf "%s\n" "$meta" >"$RUN_DIR/meta.json" || exit 1
slot=$(printf "%s" "$5" | tr , _)
printf "%s\n" "${slot:-cpu}" >"$RUN_DIR/slot" || exit 1
# A checkpoint staged for this attempt (stage_resume.sh) moves into the run directory it resumes in.
if [ -d "$RIGSYNC_ROOT/resume/$name" ]; then mv -T "$RIGSYNC_ROOT/resume/$name" "$RUN_DIR/resume" || exit 1; fi
printf "%s" "$wrapper" >"$RUN_DIR/wrapper.sh" || exit 1
cd "$RUN_DIR" || exit 1
# printf is a builtin: the records reach the pipe without ever being a process's argument.
{ [ "${#job_env[@]}" -eq 0 ] || printf '%s\0' "${job_env[@]}"; } |
  setsid nohup bash "$RUN_DIR/wrapper.sh" "$RUN_DIR" "$@" >/dev/null 2>&1 &
spawned=$!
# The wrapper records its own pid (the session leader, which setsid may have forked); wait for it briefly.
for _ in $(seq 1 50); do
  [ -s "$RUN_DIR/pid" ] && break
  sleep 0.02
done
# The attempt's identity, for the controller to record: the session leader's pid and its start time (clock ticks
# since boot, /proc/<pid>/stat field 22). The spawned process when it leads its session (setsid did not fork), else
# the pid the wrapper wrote before it started any command of the job's.
pid=$spawned
if [ "$(_rs_stat_field "$pid" 6)" != "$pid" ]; then pid=$(cat "$RUN_DIR/pid" 2>/dev/null); fi
case "$pid" in '' | *[!0-9]*) pid=$spawned ;; esac
# A wrapper whose command was short may be gone already: its start is then the one it wrote beside its pid.
if ! started=$(_rs_stat_field "$pid" 22) && [ "$(cat "$RUN_DIR/pid" 2>/dev/null)" = "$pid" ]; then
  started=$(head -c 24 "$RUN_DIR/pid_start" 2>/dev/null)
fi
case "$started" in '' | *[!0-9]*) printf "%s\n" "$pid" ;; *) printf "%s %s\n" "$pid" "$started" ;; esac
