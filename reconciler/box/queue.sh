# shellcheck shell=bash
# The box's fence and queue, shared by launch.sh, enqueue.sh, dequeue.sh and kill.sh (commands.py puts it after
# lib.sh and proc.sh in front of those). The fence, $RIGSYNC_ROOT/epoch, is the highest lease epoch the box was
# shown; it only rises, under flock on epoch.lock (the probe takes the same lock). A slot is a GPU mask written
# with '_' ("0", "0_1"; "cpu" for none); its queue is queue/<slot>/<seq>-<run>.<attempt>/, in lexical order.

# The fence as a plain number (0 when there is none or the file says something else).
_rs_read_epoch() {
  local e
  e=$(head -c 32 "$RIGSYNC_ROOT/epoch" 2>/dev/null)
  case $e in '' | 0?* | *[!0-9]*) e=0 ;; esac
  [ "${#e}" -le 18 ] || e=0
  printf "%s\n" "$e"
}

# Raise the fence to epoch $1, or refuse it: status 1 when $1 (> 0) is older than the fence, which is printed
# either way. Epoch 0 (no lease) never refuses and never lowers.
_rs_fence() {
  local epoch=$1
  case $epoch in '' | *[!0-9]*) epoch=0 ;; esac
  [ "${#epoch}" -le 18 ] || return 2
  mkdir -p "$RIGSYNC_ROOT" || return 2
  (
    flock -w 30 8 || exit 2
    fence=$(_rs_read_epoch)
    if [ "$epoch" -gt 0 ] && [ "$epoch" -lt "$fence" ]; then
      printf "%s\n" "$fence"
      exit 1
    fi
    if [ "$epoch" -gt "$fence" ]; then
      printf "%s\n" "$epoch" >"$RIGSYNC_ROOT/epoch.tmp" && mv -f "$RIGSYNC_ROOT/epoch.tmp" "$RIGSYNC_ROOT/epoch" || exit 2
      fence=$epoch
    fi
    printf "%s\n" "$fence"
  ) 8>>"$RIGSYNC_ROOT/epoch.lock"
}

# Give an attempt that never ran here its end: its run directory made (the launch lock launch.sh takes) holding
# only exit code $2, end time, reason $3 and a tombstone, as kill.sh makes them. Status 1 when the directory exists.
_rs_tombstone() {
  mkdir -p "$RIGSYNC_ROOT/runs" && mkdir "$1" 2>/dev/null || return 1
  printf "%s\n" "$2" >"$1/exit_code"
  date +%s.%N >"$1/ended_at"
  printf "%s\n" "$3" >"$1/killed_reason"
  : >"$1/tombstone"
}

# Whether GPU slots $1 and $2 share a GPU.
_rs_slots_meet() {
  local a b
  local -a x y
  IFS=_ read -r -a x <<<"$1"
  IFS=_ read -r -a y <<<"$2"
  for a in "${x[@]}"; do for b in "${y[@]}"; do [ "$a" = "$b" ] && return 0; done; done
  return 1
}

# Whether a live attempt holds a GPU of slot $1: a run directory without an exit code whose wrapper is alive, or
# without a pid yet and so young (under 30 s) that its wrapper may still write one. One without a slot file holds them all.
_rs_slot_busy() {
  local d pid held now
  now=$(date +%s)
  for d in "$RIGSYNC_ROOT"/runs/*/; do
    if [ ! -d "$d" ] || [ -e "$d/exit_code" ]; then continue; fi
    pid=$(head -c 16 "$d/pid" 2>/dev/null)
    case $pid in '' | *[!0-9]*) pid= ;; esac
    if [ -n "$pid" ]; then
      if [ "$pid" -le 1 ] || ! _rs_alive "$pid"; then continue; fi
    elif [ $((now - $(stat -c %Y "$d" 2>/dev/null || echo 0))) -ge 30 ] || [ -e "$d/ended_at" ]; then
      continue
    fi
    held=$(head -c 256 "$d/slot" 2>/dev/null) || return 0
    [ -n "$held" ] || return 0
    _rs_slots_meet "$1" "$held" && return 0
  done
  return 1
}
