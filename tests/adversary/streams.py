"""Harvest streams a hostile box sends instead of ``harvest.py``'s: built here, byte for byte, so a test can put one
on a box (``boxes.make_harvest_liar``) or hand it to the store directly.

* ``sparse_member``: an old-GNU sparse member (type ``S``) whose map puts ``data`` at the end of a file of
  ``realsize`` bytes: the stream carries ``len(data)`` bytes, an unpacker that honours the map writes a file of
  ``realsize`` (sparse on a file system that supports holes, ``realsize`` bytes of disk on one that does not).
* ``harvest_stream``: such members, then plain files, then a manifest that lists only the plain files (a liar's
  manifest need not mention what it smuggles).
"""

from __future__ import annotations

import io
import json
import tarfile

_SPARSE_MAP = 386  # the old-GNU header's four (offset, numbytes) pairs, 12 octal bytes each
_REALSIZE = 483  # its realsize field, 12 octal bytes
_CHKSUM = slice(148, 156)


def _octal(n: int) -> bytes:
    """A 12-byte octal field: 11 digits and a NUL, or 12 digits (GNU tar's way past 8 GiB)."""
    digits = f"{n:011o}"
    if len(digits) > 12:
        raise ValueError(f"{n} does not fit a 12-byte octal field")
    return digits.encode() + b"\0" * (12 - len(digits))


def sparse_member(name: str, realsize: int, data: bytes = b"rigsync adversary data!") -> bytes:
    """One old-GNU sparse member: header and data blocks (``data`` placed at ``realsize - len(data)``)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = len(data)
    info.mode = 0o644
    head = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    head[_SPARSE_MAP : _SPARSE_MAP + 24] = _octal(realsize - len(data)) + _octal(len(data))
    head[_REALSIZE : _REALSIZE + 12] = _octal(realsize)
    head[_CHKSUM] = b" " * 8
    head[_CHKSUM] = f"{sum(head[:512]):06o}".encode() + b"\0 "
    pad = (-len(data)) % tarfile.BLOCKSIZE
    return bytes(head) + data + b"\0" * pad


def harvest_stream(sparse: dict[str, int], files: dict[str, bytes]) -> bytes:
    """A harvest stream: a sparse member per ``sparse`` entry (name -> apparent size), then ``files``, then a
    manifest naming ``files`` only."""
    buf = io.BytesIO()
    for name, realsize in sparse.items():
        buf.write(sparse_member(name, realsize))
    manifest = {"v": 1, "what": "run", "cap": 256 << 20, "bytes": sum(map(len, files.values())),
                "files": [[n, len(d)] for n, d in files.items()], "skipped": [], "resumed_from": None}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in {**files, ".rigsync-harvest.json": json.dumps(manifest).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def many_members(n: int) -> bytes:
    """A harvest stream of ``n`` empty files (``out/many/f000000`` ...) and a manifest that lists them all: more
    members than any harvest of ``harvest.py`` holds."""
    buf = io.BytesIO()
    names = [f"out/many/f{i:06d}" for i in range(n)]
    for name in names:
        buf.write(tarfile.TarInfo(name).tobuf(format=tarfile.GNU_FORMAT))
    manifest = {"v": 1, "what": "run", "cap": 256 << 20, "bytes": 0, "files": [[m, 0] for m in names],
                "skipped": [], "resumed_from": None}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo(".rigsync-harvest.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
