# shellcheck shell=bash
# Queue one run attempt behind its GPU slot's current one, for the box to start the moment the slot frees
# (dequeue.sh, run by the wrapper of the attempt that ends and, as a backstop, by every probe). Prints "queued".
# Arguments: the slot ("0", "0_1"; "cpu"), the exit code for "draining", launch.sh's text and dequeue.sh's text
# (each installed under bin/, so the box can start the entry without the controller), then launch.sh's own
# arguments (see launch.sh: name, lock exit, record count, epoch, fenced exit, meta, wrapper, wrapper arguments).
# Stdin: the job environment records, as launch.sh reads them. They are kept until the start in the entry's env
# file, mode 0600, which the dequeue deletes the moment the launch opened it. A file on a rented box is readable
# by whoever controls the box, root or the provider: the box is the stranger's anyway, and the launch itself holds
# the same values in memory there.
# Refused with the draining exit code on a draining box, with launch.sh's fenced exit code when the epoch is older
# than the box's fence, and with its lock exit code when the attempt has a run directory or an entry already. The
# entry is built in a hidden temporary directory and renamed into place, so a dequeue sees it whole or not at all.
slot=$1
drain_exit=$2
launch_text=$3
dequeue_text=$4
shift 4
name=$1
lock_exit=$2
env_count=$3
epoch=$4
fence_exit=$5
case $slot in '' | *[!0-9a-z_]*) echo "enqueue: slot '$slot' is not a GPU slot" >&2 && exit 1 ;; esac
case $env_count in '' | *[!0-9]*) echo "enqueue: the job environment record count is not a number" >&2 && exit 1 ;; esac
if [ -e "$RIGSYNC_ROOT/drain" ]; then
  echo "enqueue refused: the box is draining" >&2
  exit "$drain_exit"
fi
fence=$(_rs_fence "$epoch")
case $? in
  0) ;;
  1)
    echo "enqueue refused: epoch $epoch is older than the box's fence $fence" >&2
    exit "$fence_exit"
    ;;
  *)
    echo "enqueue: cannot read or raise the box's fence (epoch $epoch)" >&2
    exit 1
    ;;
esac
Q=$RIGSYNC_ROOT/queue/$slot
mkdir -p "$Q" "$RIGSYNC_ROOT/bin" || exit 1
for f in launch dequeue; do
  if [ "$f" = launch ]; then text=$launch_text; else text=$dequeue_text; fi
  printf "%s" "$text" >"$RIGSYNC_ROOT/bin/$f.sh.tmp.$$" && mv -f "$RIGSYNC_ROOT/bin/$f.sh.tmp.$$" "$RIGSYNC_ROOT/bin/$f.sh" || exit 1
done
tmp=$(mktemp -d "$Q/.new.XXXXXX") || exit 1
(
  umask 077
  if [ "$env_count" -gt 0 ]; then cat >"$tmp/env"; else : >"$tmp/env"; fi
) || { rm -rf "$tmp"; exit 1; }
if ! printf '%s\0' "$@" >"$tmp/argv" || ! printf "%s\n" "$epoch" >"$tmp/epoch"; then
  rm -rf "$tmp"
  exit 1
fi
(
  flock -w 30 9 || exit 1
  for e in "$RIGSYNC_ROOT"/queue/*/[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-"$name"; do
    if [ -e "$e" ]; then echo "launch lock held: runs/$name is queued already" >&2 && exit "$lock_exit"; fi
  done
  if [ -e "$RIGSYNC_ROOT/runs/$name" ]; then
    echo "launch lock held: run directory runs/$name already exists" >&2
    exit "$lock_exit"
  fi
  n=$(($(head -c 16 "$Q.seq" 2>/dev/null | tr -cd 0-9 | sed 's/^0*//') + 1))
  printf "%s\n" "$n" >"$Q.seq" && mv -T "$tmp" "$Q/$(printf %012d "$n")-$name"
) 9>>"$Q.lock"
code=$?
if [ "$code" -ne 0 ]; then rm -rf "$tmp"; exit "$code"; fi
bash "$RIGSYNC_ROOT/bin/dequeue.sh" "$slot" </dev/null >/dev/null 2>&1
echo queued
