# shellcheck shell=bash
# Run the fleet's bootstrap script once per box per hash, detached (see bootstrap_run.sh). Prints "ok" (already
# done), "ok cache SIZE SHA256" (done now: the runner uploaded the bootstrap cache, said once), "running" (a live
# run holds the lock) or "started <pid>"; a previous failure is retried.
# Arguments: the script's hash, the script's text, bootstrap_run.sh's text; with a bootstrap cache also
# transfer.py's text, the cache key, the recorded size and SHA-256 of the cache object to restore (both empty:
# none), "put" to upload what the script builds (empty: no upload) and the cached paths. The cache's presigned URLs
# come on stdin, never on the command line, one a line: the download's (with a size), then the upload's (with
# "put"). They reach the detached runner through a pipe, never a file.
h=$1
script=$2
runner=$3
B=$RIGSYNC_ROOT/bootstrap
mkdir -p "$B" || exit 1
if [ -e "$B/$h.ok" ]; then
  echo ok
  exit 0
fi
# The runner left what it uploaded for the controller to record: report it once, and the bootstrap is done.
if mv "$B/$h.uploaded" "$B/$h.reported" 2>/dev/null; then
  read -r size sha <"$B/$h.reported"
  date +%s.%N >"$B/$h.ok.tmp" && mv -f "$B/$h.ok.tmp" "$B/$h.ok" || exit 1
  echo "ok cache $size $sha"
  exit 0
fi
urls=()
if [ "$#" -gt 3 ]; then
  want=0
  [ -n "$6" ] && want=$((want + 1))
  [ -n "$8" ] && want=$((want + 1))
  mapfile -t -n "$want" urls
  if [ "${#urls[@]}" -ne "$want" ]; then
    echo "expected $want URLs on stdin, got ${#urls[@]}" >&2
    exit 2
  fi
  printf "%s" "$4" >"$B/transfer.py.tmp" && mv -f "$B/transfer.py.tmp" "$B/transfer.py" || exit 1
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
# Runner arguments: the bootstrap directory, the hash, then (with a cache) the Python for transfer.py, the key, the
# recorded size and SHA-256, "put" or not, the paths.
args=("$B" "$h")
if [ "$#" -gt 3 ]; then
  args+=("$(_rs_best_python || echo python3)" "${@:5}")
fi
printf "%s\n" "${urls[@]}" | setsid nohup bash "$B/$h.run.sh" "${args[@]}" >/dev/null 2>&1 &
spawned=$!
unset urls
for _ in $(seq 1 50); do
  [ -s "$B/$h.pid" ] && break
  sleep 0.02
done
# A runner slow to start (a loaded box) has not written its pid yet: its pid is the one spawned (setsid and nohup
# exec), written here, or the next call would take the lock for stale and start a second runner.
[ -s "$B/$h.pid" ] || printf "%s\n" "$spawned" >"$B/$h.pid"
echo "started $(cat "$B/$h.pid" 2>/dev/null || echo "$spawned")"
