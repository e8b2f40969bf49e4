# shellcheck shell=bash
# Launch one run attempt: take the launch lock (an atomic mkdir of the attempt's directory), write meta.json and
# the wrapper, start the wrapper detached in a session of its own, and print its pid.
# Arguments: the attempt's directory name, the exit code for "lock held", the meta.json text, the wrapper's
# text, then the wrapper's own arguments after its first (see wrapper.sh).
name=$1
lock_exit=$2
meta=$3
wrapper=$4
shift 4
RUN_DIR=$RIGSYNC_ROOT/runs/$name
mkdir -p "$RIGSYNC_ROOT/runs" || exit 1
if ! mkdir "$RUN_DIR" 2>/dev/null; then
  echo "launch lock held: run directory runs/$name already exists" >&2
  exit "$lock_exit"
fi
printf "%s\n" "$meta" >"$RUN_DIR/meta.json" || exit 1
# A checkpoint staged for this attempt (stage_resume.sh) moves into the run directory it resumes in.
if [ -d "$RIGSYNC_ROOT/resume/$name" ]; then mv -T "$RIGSYNC_ROOT/resume/$name" "$RUN_DIR/resume" || exit 1; fi
printf "%s" "$wrapper" >"$RUN_DIR/wrapper.sh" || exit 1
cd "$RUN_DIR" || exit 1
setsid nohup bash "$RUN_DIR/wrapper.sh" "$RUN_DIR" "$@" >/dev/null 2>&1 </dev/null &
spawned=$!
# The wrapper records its own pid (the session leader, which setsid may have forked); wait for it briefly.
for _ in $(seq 1 50); do
  [ -s "$RUN_DIR/pid" ] && break
  sleep 0.02
done
if [ -s "$RUN_DIR/pid" ]; then cat "$RUN_DIR/pid"; else printf "%s\n" "$spawned"; fi
