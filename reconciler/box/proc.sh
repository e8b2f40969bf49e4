# shellcheck shell=bash
# Reading and ending processes by what /proc says of them, for the scripts that end a run: kill.sh, launch.sh
# (which reports the identity kill.sh checks) and wrapper.sh. reconciler/remote/commands.py puts it after lib.sh in
# front of those three only (the watchdog's onstart carries lib.sh and must stay small).

# Field $2 of /proc/$1/stat, numbered as in proc(5) (3 = state, 5 = pgrp, 6 = session, 22 = starttime), read
# after the last ')': the command name in field 2 may hold spaces and parentheses.
_rs_stat_field() {
  local line rest
  local -a f
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  rest=${line##*) }
  read -r -a f <<<"$rest"
  [ "$2" -ge 3 ] && [ -n "${f[$(($2 - 3))]:-}" ] || return 1
  printf "%s\n" "${f[$(($2 - 3))]}"
}

# True when $1 is a pid > 1 (a plain number, no sign, no leading zero) that is alive, started at clock tick $2
# (a plain number), leads its own session and, given $3 (an attempt's wrapper.sh path), has that path as one of
# its arguments: the process group a launch recorded, and no other. The path matters for an identity the box
# reported (the launch of a queued attempt): a job can forge it, never the command line of another process.
_rs_recorded_group() {
  case "$1" in '' | 0* | *[!0-9]*) return 1 ;; esac
  case "$2" in '' | *[!0-9]*) return 1 ;; esac
  [ "${#1}" -le 7 ] && [ "$1" -gt 1 ] || return 1
  [ "$(_rs_stat_field "$1" 22)" = "$2" ] || return 1
  [ "$(_rs_stat_field "$1" 6)" = "$1" ] || return 1
  [ "$(_rs_stat_field "$1" 3)" != "Z" ] || return 1
  [ -z "${3:-}" ] || tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF -- "$3"
}

# The live members of process group $1, one pid a line, except the pids after it (and this shell itself).
_rs_members() {
  local pgid=$1 f p x line rest skip
  local -a fields
  shift
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    p=${f#/proc/}
    p=${p%/stat}
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    if [ "${fields[2]:-}" != "$pgid" ] || [ "${fields[0]:-}" = "Z" ]; then continue; fi
    skip=
    for x in "$BASHPID" "$@"; do [ "$p" = "$x" ] && skip=1; done
    [ -n "$skip" ] || printf "%s\n" "$p"
  done
}

# End the members of process group $1 except the pids after it (the wrapper and its heartbeat): TERM, then KILL
# whatever is left after 3 s. Members are signalled one by one, so the process that asks survives.
_rs_end_members() {
  local pgid=$1
  local -a members
  shift
  mapfile -t members < <(_rs_members "$pgid" "$@")
  [ "${#members[@]}" -gt 0 ] || return 0
  kill -TERM "${members[@]}" 2>/dev/null
  for _ in $(seq 1 30); do
    mapfile -t members < <(_rs_members "$pgid" "$@")
    [ "${#members[@]}" -gt 0 ] || return 0
    sleep 0.1
  done
  for _ in 1 2 3; do
    kill -KILL "${members[@]}" 2>/dev/null
    sleep 0.1
    mapfile -t members < <(_rs_members "$pgid" "$@")
    [ "${#members[@]}" -gt 0 ] || return 0
  done
}

# The live members of the session and process group $1 (a recorded wrapper pid > 1, itself gone) that started at or
# after clock tick $2 (its recorded start): what its command left running when the wrapper died. While they live
# the id $1 stays theirs (the kernel gives no new process an id still in use as a group's), and they all started
# after the recorded wrapper did, so they are that attempt's processes.
_rs_orphans() {
  local f p line rest
  local -a fields
  case "$1" in '' | 0* | *[!0-9]*) return 0 ;; esac
  case "$2" in '' | *[!0-9]*) return 0 ;; esac
  [ "${#1}" -le 7 ] && [ "$1" -gt 1 ] || return 0
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    p=${f#/proc/}
    p=${p%/stat}
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    if [ "${fields[2]:-}" != "$1" ] || [ "${fields[3]:-}" != "$1" ] || [ "${fields[0]:-}" = "Z" ]; then continue; fi
    case "${fields[19]:-}" in '' | *[!0-9]*) continue ;; esac
    if [ "${#fields[19]}" -gt 18 ] || [ "${#2}" -gt 18 ] || [ "${fields[19]}" -lt "$2" ]; then continue; fi
    [ "$p" != "$BASHPID" ] && printf "%s\n" "$p"
  done
}
