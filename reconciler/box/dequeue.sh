# shellcheck shell=bash
# Start the head of one GPU slot's queue when nothing live holds the slot (enqueue.sh writes the entries). Run by
# the wrapper after an attempt's end, by enqueue.sh, and by the probe for every slot with entries (a wrapper killed
# -9 never runs it). Under flock on the slot's lock, entry by entry in order: one whose run directory exists is
# dropped (a kill's tombstone took the launch lock, or it started before); one older than the box's fence is
# tombstoned "fenced: epoch A < B" and dropped; the first other one starts through launch.sh, the same code path as
# a direct launch, and launch.sh's answer `PID START` goes to its run directory's `launched` file, where the probe
# reports it. Installed under bin/ by enqueue.sh, with lib.sh, proc.sh and queue.sh in front.
# Argument: the slot.
slot=$1
case $slot in '' | *[!0-9a-z_]*) exit 1 ;; esac
Q=$RIGSYNC_ROOT/queue/$slot
[ -d "$Q" ] || exit 0
exec 9>>"$Q.lock"
flock -w 60 9 || exit 1
while :; do
  head=
  for e in "$Q"/[0-9]*-*; do
    if [ -d "$e" ]; then head=$e && break; fi
  done
  [ -n "$head" ] || exit 0
  name=${head##*/}
  name=${name#*-}
  RUN_DIR=$RIGSYNC_ROOT/runs/$name
  if [ -e "$RUN_DIR" ]; then rm -rf "$head" && continue; fi
  _rs_slot_busy "$slot" && exit 0
  epoch=$(head -c 32 "$head/epoch" 2>/dev/null)
  case $epoch in '' | *[!0-9]*) epoch=0 ;; esac
  [ "${#epoch}" -le 18 ] || epoch=0
  fence=$(_rs_read_epoch)
  if [ "$epoch" -gt 0 ] && [ "$epoch" -lt "$fence" ]; then
    _rs_tombstone "$RUN_DIR" 137 "fenced: epoch $epoch < $fence"
    rm -rf "$head" && continue
  fi
  argv=()
  mapfile -d '' -t argv <"$head/argv"
  if [ "${#argv[@]}" -lt 7 ] || ! exec 3<"$head/env"; then
    _rs_tombstone "$RUN_DIR" 137 "never launched here: its queue entry is incomplete"
    rm -rf "$head" && continue
  fi
  rm -f "$head/env"
  out=$(bash "$RIGSYNC_ROOT/bin/launch.sh" "${argv[@]}" <&3 3<&- 9>&- 2>"$head/stderr")
  code=$?
  exec 3<&-
  if [ "$code" -eq 0 ]; then
    printf "%s\n" "$out" >"$RUN_DIR/launched.tmp" && mv -f "$RUN_DIR/launched.tmp" "$RUN_DIR/launched"
    rm -rf "$head"
    exit 0
  fi
  if [ "$code" = "${argv[4]}" ]; then
    _rs_tombstone "$RUN_DIR" 137 "fenced: epoch $epoch < $(_rs_read_epoch)"
  elif [ "$code" != "${argv[1]}" ]; then
    _rs_tombstone "$RUN_DIR" 137 "never launched here: its queued launch exited $code: $(tail -c 200 "$head/stderr")"
  fi
  rm -rf "$head"
done
