"""Writing a file so that a reader, or a board that loses power, sees the old one or the new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: str | Path, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` beside ``path``, flush it to the card, then rename it over ``path``: the rename
    is atomic on POSIX file systems, and the fsync first makes it reach the card before the rename
    does. A failure leaves ``path`` as it was and no temporary file behind."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path
