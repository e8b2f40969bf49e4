# shellcheck shell=bash
# Print a slice of one attempt's log for `rigsync logs`: a header line, then the bytes. Reads only.
# Arguments: the attempt's directory name, the log's file name, the byte offset to start at, the most bytes to
# print, how many last lines to start with instead of the offset (-1: use the offset), the exit code for "no such
# run", and how many of the log's last bytes the last lines are looked for in (a 2 GiB log is never read whole). The header is `rigsync-log EXIT ALIVE START END SIZE`: EXIT is the recorded exit code or `-`, ALIVE is 1
# while the wrapper lives, 0 once it is gone, `-` before it wrote its pid; the bytes [START, END) of the file follow.
name=$1
file=$2
offset=$3
max=$4
lines=$5
missing_exit=$6
window=$7
RUN_DIR=$RIGSYNC_ROOT/runs/$name
if [ ! -d "$RUN_DIR" ]; then
  echo "no run directory runs/$name on this box" >&2
  exit "$missing_exit"
fi
# The exit code is read before the size: the wrapper writes it only after the command ended, so once it is there
# the size read below is the log's final size.
ended=-
if [ -s "$RUN_DIR/exit_code" ]; then
  ended=$(head -c 32 "$RUN_DIR/exit_code" | tr -dc '0-9-')
  # what the job's box wrote there may be anything: only a plain integer of at most 10 digits is passed on
  case "$ended" in "" | - | *[!0-9-]* | ?*-* | -*[!0-9]*) ended=- ;; esac
  digits=${ended#-}
  [ "${#digits}" -le 10 ] || ended=-
fi
alive=-
pid=$(cat "$RUN_DIR/pid" 2>/dev/null)
case "$pid" in "" | *[!0-9]*) pid= ;; esac
if [ -n "$pid" ]; then
  if _rs_alive "$pid"; then alive=1; else alive=0; fi
fi
size=0
if [ -f "$RUN_DIR/$file" ]; then
  size=$(wc -c <"$RUN_DIR/$file")
  size=$((size))
fi
if [ "$lines" -ge 0 ]; then
  # the last lines of the first $size bytes, looked for in at most the last $window bytes
  skip=0
  if [ "$size" -gt "$window" ]; then skip=$((size - window)); fi
  tail_bytes=0
  if [ "$size" -gt 0 ]; then
    tail_bytes=$(tail -c +$((skip + 1)) "$RUN_DIR/$file" | head -c $((size - skip)) | tail -n "$lines" | wc -c)
  fi
  offset=$((size - tail_bytes))
fi
if [ "$offset" -gt "$size" ]; then offset=$size; fi
end=$((offset + max))
if [ "$end" -gt "$size" ]; then end=$size; fi
printf "rigsync-log %s %s %s %s %s\n" "$ended" "$alive" "$offset" "$end" "$size"
if [ "$end" -gt "$offset" ]; then
  tail -c +$((offset + 1)) "$RUN_DIR/$file" | head -c $((end - offset))
fi
