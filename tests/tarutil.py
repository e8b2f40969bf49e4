"""A tar of in-memory files, as tests build harvests and checkpoints (both tiers: tests/ is on sys.path)."""

from __future__ import annotations

import io
import tarfile


def tar_of(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar holding ``files`` (name -> bytes), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
