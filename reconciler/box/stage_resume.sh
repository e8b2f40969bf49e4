# shellcheck shell=bash
# Stage a checkpoint for an attempt about to launch: unpack a tar stream from stdin (or a tar file: the one
# fetch_resume.sh downloaded and checked) into resume/<name>/ (a temporary directory renamed into place; idempotent:
# a staged copy is replaced). launch.sh moves it into the new run directory once it holds the launch lock, and the
# wrapper points RIGSYNC_RESUME_DIR at it.
# Arguments: the attempt's directory name, optionally the tar file (default: stdin).
name=$1
src=${2:--}
S=$RIGSYNC_ROOT/resume
D=$S/$name
mkdir -p "$S" || exit 1
T=$D.tmp.$$
rm -rf "$T"
mkdir -p "$T" || exit 1
if ! tar -x -C "$T" -f "$src"; then
  rm -rf "$T"
  echo "unpacking the checkpoint tar failed" >&2
  exit 1
fi
rm -rf "$D"
mv -T "$T" "$D" || exit 1
echo staged
