# shellcheck shell=bash
# Upload an attempt's harvest (or its checkpoint) to the result store straight from the box, with presigned URLs:
# harvest.py writes its tar (the same stream `harvest.sh` sends, manifest last) and its manifest into a temporary
# directory under tmp/, transfer.py PUTs the tar to the first URL, then each named run-directory file, as the
# harvest took it (the same caps and refusals: a file it skipped is not uploaded either; the manifest by its name
# .rigsync-harvest.json), to its own URL; a file the run did not write is skipped. The temporary directory goes.
# The URLs arrive on stdin, one a line (the tar's, then one per name, in order), and stay in this shell's memory:
# never in an argument, never in a file. Prints harvest.py's counts line, then transfer.py's line for the tar.
# Arguments: harvest.py's bundle, transfer.py's bundle, the attempt's directory name, what (run or checkpoint),
# the cap in bytes, the patterns (JSON), the exit code for "no such run directory", then the file names.
harvest=$1 transfer=$2 name=$3 what=$4 cap=$5 patterns=$6 missing_exit=$7
shift 7
want=$(($# + 1))
mapfile -t -n "$want" urls
if [ "${#urls[@]}" -ne "$want" ]; then
  echo "expected $want URLs on stdin, got ${#urls[@]}" >&2
  exit 2
fi
py=$(_rs_best_python) || {
  echo "no python3 on the box: the upload needs one" >&2
  exit 1
}
if [ ! -d "$RIGSYNC_ROOT/runs/$name" ]; then
  echo "no run directory runs/$name on this box" >&2
  exit "$missing_exit"
fi
mkdir -p "$RIGSYNC_ROOT/tmp" && T=$(mktemp -d "$RIGSYNC_ROOT/tmp/upload.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
"$py" -c "$harvest" "$name" "$what" "$cap" "$patterns" "$missing_exit" \
  --out "$T/harvest.tar" --manifest "$T/manifest.json" </dev/null || exit
printf '%s\n' "${urls[0]}" | "$py" -c "$transfer" put "$T/harvest.tar" || exit
mkdir "$T/files" || exit 1
members=()
for f in "$@"; do [ "$f" = .rigsync-harvest.json ] || members+=("$f"); done
if [ "${#members[@]}" -gt 0 ]; then # only what the harvest took; a name it did not take is simply not there
  tar -x -C "$T/files" -f "$T/harvest.tar" -- "${members[@]}" 2>/dev/null
fi
i=1
for f in "$@"; do
  url=${urls[$i]}
  i=$((i + 1))
  src=$T/files/$f
  [ "$f" = .rigsync-harvest.json ] && src=$T/manifest.json
  if [ ! -f "$src" ] || [ -L "$src" ]; then continue; fi
  printf '%s\n' "$url" | "$py" -c "$transfer" put "$src" >/dev/null || exit
done
