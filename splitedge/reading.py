"""Reading a file someone else named (a trace's ``calibration``, a setting's path): bounded.

A path that comes from a trace, a bundle or a setting is untrusted: ``/dev/zero`` never ends (a
report read it until memory ran out), a FIFO blocks its reader for ever (a report hung on one),
``/proc/self/pagemap`` says it is 0 bytes and is not. :func:`read_bounded` opens without blocking,
checks on the open descriptor that it is a regular file (so a file swapped for a FIFO after a
check cannot hang it), and reads at most ``max_bytes``, refusing a longer file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["NotReadable", "read_bounded", "read_text_bounded"]


class NotReadable(OSError):
    """A file :func:`read_bounded` refuses: not a regular file, or longer than its cap. An
    :class:`OSError`, so a caller that already says "cannot read FILE: ..." says this too."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def read_bounded(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them; :class:`NotReadable`
    for anything else (a FIFO, a device, a directory, a longer file), ``OSError`` as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open does not wait for a writer
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotReadable(f"not a regular file ({_kind(mode)})")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotReadable(f"longer than {max_bytes:,} bytes")
    return data


def read_text_bounded(path: str | Path, max_bytes: int) -> str:
    """:func:`read_bounded` as UTF-8 text (``UnicodeDecodeError`` where it is not)."""
    return read_bounded(path, max_bytes).decode("utf-8")
