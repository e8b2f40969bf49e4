# shellcheck shell=bash
# Start the box's watchdog (watchdog.py, see its docstring) from the instance's onstart: write the program and its
# supervisor (watchdog_run.sh) under watchdog/, record the box's start once (the ttl counts from the first boot on
# this disk), and start the supervisor detached unless one is alive. Prints "running" or "started <pid>".
# Arguments: watchdog.py's text, watchdog_run.sh's text, then the watchdog's own arguments (ttl seconds or
# "none", idle_timeout seconds, orphan_timeout seconds).
program=$1
runner=$2
shift 2
W=$RIGSYNC_ROOT/watchdog
mkdir -p "$W" || exit 1
_wd_log() { printf "%s %s\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" >>"$W/watchdog.log"; }
printf "%s" "$program" >"$W/watchdog.py.tmp" && mv -f "$W/watchdog.py.tmp" "$W/watchdog.py" || exit 1
printf "%s" "$runner" >"$W/run.sh.tmp" && mv -f "$W/run.sh.tmp" "$W/run.sh" || exit 1
if [ ! -s "$W/started_at" ]; then
  date +%s.%N >"$W/started_at.tmp" && mv -f "$W/started_at.tmp" "$W/started_at"
fi
# A pid file that survived a container restart may name an unrelated process now: check it is our supervisor.
pid=$(cat "$W/pid" 2>/dev/null)
if _rs_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$W/run.sh"; then
  echo running
  exit 0
fi
if ! py=$(_rs_best_python); then
  _wd_log "not started: no python3 on this box (the watchdog needs one, like the probe)"
  echo "no python3 on this box: the watchdog is not running" >&2
  exit 1
fi
rm -f "$W/pid"
setsid nohup bash "$W/run.sh" "$W" "$py" "$@" >/dev/null 2>&1 </dev/null &
spawned=$!
for _ in $(seq 1 50); do
  [ -s "$W/pid" ] && break
  sleep 0.02
done
echo "started $(cat "$W/pid" 2>/dev/null || echo "$spawned")"
