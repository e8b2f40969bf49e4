# shellcheck shell=bash
# Run the fleet's bootstrap script once per box per hash, detached (see bootstrap_run.sh). Prints "ok" (already
# done), "running" (a live run holds the lock) or "started <pid>"; a previous failure is retried.
# Arguments: the script's hash, the script's text, bootstrap_run.sh's text.
h=$1
script=$2
runner=$3
B=$RIGSYNC_ROOT/bootstrap
mkdir -p "$B" || exit 1
if [ -e "$B/$h.ok" ]; then
  echo ok
  exit 0
fi
if ! mkdir "$B/$h.lock" 2>/dev/null; then
  if _rs_alive "$(cat "$B/$h.pid" 2>/dev/null)"; then
    echo running
    exit 0
  fi
  rm -rf "$B/$h.lock"
  mkdir "$B/$h.lock" 2>/dev/null || {
    echo running
    exit 0
  }
fi
rm -f "$B/$h.failed" "$B/$h.pid"
printf "%s" "$script" >"$B/$h.sh.tmp" || exit 1
mv -f "$B/$h.sh.tmp" "$B/$h.sh" || exit 1
printf "%s" "$runner" >"$B/$h.run.sh" || exit 1
setsid nohup bash "$B/$h.run.sh" "$B" "$h" >/dev/null 2>&1 </dev/null &
spawned=$!
for _ in $(seq 1 50); do
  [ -s "$B/$h.pid" ] && break
  sleep 0.02
done
echo "started $(cat "$B/$h.pid" 2>/dev/null || echo "$spawned")"
