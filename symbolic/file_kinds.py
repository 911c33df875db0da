"""What a path that is not a regular file is, told without opening it (a FIFO would block)."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

__all__ = ["non_regular_kind", "open_regular"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def non_regular_kind(mode: int) -> str | None:
    """``"a FIFO (named pipe)"``, ``"a folder"``… for a ``st_mode`` that is not a regular file's; else ``None``."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def open_regular(path: os.PathLike | str) -> BinaryIO:
    """``path`` opened for reading without blocking; ``ValueError`` naming its kind unless a regular file."""
    kind = non_regular_kind(os.stat(path).st_mode)
    if kind is None:
        stream = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
        kind = non_regular_kind(os.fstat(stream.fileno()).st_mode)  # replaced since the stat
        if kind is None:
            return stream
        stream.close()
    raise ValueError(f"it is {kind}, not a regular file")
