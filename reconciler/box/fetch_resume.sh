# shellcheck shell=bash
# Stage a checkpoint the box downloads from the result store itself: transfer.py GETs the presigned URL (stdin's
# first line, kept in this shell's memory) into a temporary file under tmp/ and checks the size and SHA-256 the
# controller recorded; only then does stage_resume.sh unpack it, exactly as it unpacks a streamed one. A mismatch
# or a failed download stages nothing. The temporary directory goes. Arguments: transfer.py's bundle,
# stage_resume.sh's text, the attempt's directory name, the recorded size, the recorded SHA-256.
transfer=$1 stage=$2 name=$3 size=$4 sha=$5
IFS= read -r url || [ -n "$url" ] || {
  echo "no URL on stdin" >&2
  exit 2
}
py=$(_rs_best_python) || {
  echo "no python3 on the box: the download needs one" >&2
  exit 1
}
mkdir -p "$RIGSYNC_ROOT/tmp" && T=$(mktemp -d "$RIGSYNC_ROOT/tmp/fetch.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
printf '%s\n' "$url" | "$py" -c "$transfer" get "$T/checkpoint.tar" "$size" "$sha" || exit
bash -c "$stage" rigsync-stage-resume "$name" "$T/checkpoint.tar" </dev/null
