# shellcheck shell=bash
# Runs one bootstrap script from $HOME, logs its output, and leaves a <hash>.ok or <hash>.failed marker (with the
# exit code) before releasing the lock. bootstrap.sh writes it to <hash>.run.sh and starts it detached.
# Arguments: the bootstrap directory, the script's hash; with a bootstrap cache also the Python that runs
# transfer.py (written beside it by bootstrap.sh), the cache key, the recorded size and SHA-256 of the cache
# object (empty: none to restore), "put" (or empty: no upload) and the cached paths. Stdin: the download URL (with
# a size), then the upload URL (with "put"), read once and kept in variables only (transfer.py reads each on its
# stdin).
#
# With a cache object to restore, it is downloaded (transfer.py checks size and SHA-256), unpacked over / and the
# bootstrap is done without running the script ("restored from cache KEY" in the log); any failure of that runs the
# script (and says so). After the script succeeds with an upload URL, the paths are packed (as they are, rigsync's
# own directory left out) and uploaded, and what was uploaded is left in <hash>.uploaded ("SIZE SHA256") instead
# of the .ok marker: bootstrap.sh reports it to the controller once, then marks the bootstrap done.
B=$1
H=$2
printf "%s\n" "$$" >"$B/$H.pid"
PY=${3:-python3}
KEY=${4:-}
SIZE=${5:-}
SHA=${6:-}
PUT=${7:-}
shift 7 2>/dev/null || shift "$#"
get_url=
put_url=
if [ -n "$KEY" ]; then
  [ -n "$SIZE" ] && { IFS= read -r get_url || :; }
  [ -n "$PUT" ] && { IFS= read -r put_url || :; }
fi
exec </dev/null
REL=() # the cached paths as tar names them (relative to /)
for p in "$@"; do
  REL+=("${p#/}")
done
LOG=$B/$H.log
TAR=$B/$H.cache.tar
ROOT=$(dirname "$B")
: >"$LOG"
cd "$HOME" || : # the script still runs, from wherever this is

_rs_done() {
  date +%s.%N >"$B/$H.ok.tmp" && mv -f "$B/$H.ok.tmp" "$B/$H.ok"
}

_rs_restore() {
  [ -n "$get_url" ] && [ -n "$SIZE" ] && [ -n "$SHA" ] && [ "${#REL[@]}" -gt 0 ] || return 1
  rm -f "$TAR"
  if ! printf "%s\n" "$get_url" | "$PY" "$B/transfer.py" get "$TAR" "$SIZE" "$SHA" >>"$LOG" 2>&1; then
    echo "rigsync: restore from cache $KEY failed (download or check): running the script" >>"$LOG"
    return 1
  fi
  # only the declared paths come out of it (a tar that holds anything else writes nothing else)
  if ! tar -C / -xpf "$TAR" --numeric-owner -- "${REL[@]}" >>"$LOG" 2>&1; then
    echo "rigsync: restore from cache $KEY failed (unpack): running the script" >>"$LOG"
    return 1
  fi
  echo "rigsync: restored from cache $KEY" >>"$LOG"
}

_rs_upload() {
  local out size sha
  rm -f "$TAR"
  if ! tar -C / -cf "$TAR" --numeric-owner --exclude="${ROOT#/}" -- "${REL[@]}" >>"$LOG" 2>&1; then
    echo "rigsync: cache $KEY not uploaded: packing ${REL[*]} failed" >>"$LOG"
    return 1
  fi
  if ! out=$(printf "%s\n" "$put_url" | "$PY" "$B/transfer.py" put "$TAR" 2>>"$LOG"); then
    echo "rigsync: cache $KEY not uploaded: the upload failed" >>"$LOG"
    return 1
  fi
  read -r size sha < <("$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); print(int(d["size"]), str(d["sha256"]))' "$out" 2>>"$LOG")
  if [ -z "$size" ] || [ -z "$sha" ]; then
    echo "rigsync: cache $KEY not recorded: transfer.py said nothing usable" >>"$LOG"
    return 1
  fi
  printf "%s %s\n" "$size" "$sha" >"$B/$H.uploaded.tmp" && mv -f "$B/$H.uploaded.tmp" "$B/$H.uploaded" || return 1
  echo "rigsync: uploaded cache $KEY ($size bytes)" >>"$LOG"
}

if [ -n "$KEY" ] && _rs_restore; then
  rm -f "$TAR"
  _rs_done
  rm -rf "$B/$H.lock"
  exit 0
fi
bash "$B/$H.sh" >>"$LOG" 2>&1 </dev/null
c=$?
if [ "$c" -eq 0 ]; then
  if ! { [ -n "$KEY" ] && [ -n "$put_url" ] && [ "${#REL[@]}" -gt 0 ] && _rs_upload; }; then
    _rs_done
  fi
else
  printf "%s\n" "$c" >"$B/$H.failed.tmp" && mv -f "$B/$H.failed.tmp" "$B/$H.failed"
fi
rm -f "$TAR"
rm -rf "$B/$H.lock"
