# shellcheck shell=bash
# Runs one bootstrap script from $HOME, logs its output, and leaves a <hash>.ok or <hash>.failed marker (with the
# exit code) before releasing the lock. bootstrap.sh writes it to <hash>.run.sh and starts it detached.
# Arguments: the bootstrap directory, the script's hash.
B=$1
H=$2
printf "%s\n" "$$" >"$B/$H.pid"
cd "$HOME" || : # the script still runs, from wherever this is
bash "$B/$H.sh" >"$B/$H.log" 2>&1 </dev/null
c=$?
if [ "$c" -eq 0 ]; then
  date +%s.%N >"$B/$H.ok.tmp" && mv -f "$B/$H.ok.tmp" "$B/$H.ok"
else
  printf "%s\n" "$c" >"$B/$H.failed.tmp" && mv -f "$B/$H.failed.tmp" "$B/$H.failed"
fi
rm -rf "$B/$H.lock"
