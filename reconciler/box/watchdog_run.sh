# shellcheck shell=bash
# The watchdog's supervisor: watchdog_start.sh writes it to watchdog/run.sh and starts it detached. It records its
# pid and runs watchdog.py, again 5 s after any exit, for the life of the box (the program only ever exits on a
# crash or bad arguments, and says why in watchdog.log).
# Arguments: the watchdog directory, the Python interpreter, then watchdog.py's arguments.
W=$1
py=$2
shift 2
printf "%s\n" "$$" >"$W/pid.tmp" && mv -f "$W/pid.tmp" "$W/pid"
while :; do
  "$py" "$W/watchdog.py" "$@" >>"$W/watchdog.log" 2>&1 </dev/null
  code=$?
  printf "%s watchdog.py exited with %s; restarting in 5s\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$code" >>"$W/watchdog.log"
  sleep 5
done
