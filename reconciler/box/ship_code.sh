# shellcheck shell=bash
# Unpack a tar stream from stdin into code/<commit>/, atomically (a temporary directory renamed into place) and
# idempotently (an existing tree is kept and the stream discarded). Prints "present" or "unpacked".
# Arguments: the commit.
commit=$1
C=$RIGSYNC_ROOT/code
D=$C/$commit
mkdir -p "$C" || exit 1
if [ -d "$D" ]; then
  cat >/dev/null
  echo present
  exit 0
fi
T=$D.tmp.$$
rm -rf "$T"
mkdir -p "$T" || exit 1
if ! tar -x -C "$T" -f -; then
  rm -rf "$T"
  echo "unpacking the code tar failed" >&2
  exit 1
fi
if ! mv -T "$T" "$D" 2>/dev/null; then
  rm -rf "$T"
  [ -d "$D" ] || {
    echo "could not move the code tree into place" >&2
    exit 1
  }
fi
echo unpacked
