"""A disk cache for pure, slow derivations (the projection formulas).

Entries live in ``$SPLITFORMER_CACHE`` (default ``~/.cache/splitformer``; ``off`` disables
the cache) and are keyed by the generator version and a hash of the deriving module's
source, so a changed derivation is never served from an old entry.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["disk_cached", "cache_folder"]

T = TypeVar("T")


def cache_folder() -> Path | None:
    """The cache folder, or ``None`` when caching is off."""
    setting = os.environ.get("SPLITFORMER_CACHE", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "splitformer"


def _key(function: Callable) -> str:
    from . import __version__

    source = inspect.getsource(inspect.getmodule(function))
    digest = hashlib.sha256(f"{__version__}\0{function.__qualname__}\0{source}".encode()).hexdigest()[:20]
    return f"{function.__name__}-{digest}.pickle"


def disk_cached(function: Callable[[], T]) -> Callable[[], T]:
    """Cache the result of a function without arguments in memory and on disk."""

    @functools.cache
    def wrapper() -> T:
        folder = cache_folder()
        path = folder / _key(function) if folder is not None else None
        if path is not None and path.is_file():
            try:
                return pickle.loads(path.read_bytes())
            except Exception:  # a corrupt or foreign entry: derive again  # noqa: BLE001
                pass
        result = function()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                with os.fdopen(handle, "wb") as stream:
                    pickle.dump(result, stream)
                os.replace(temporary, path)
            except OSError:
                pass  # an unwritable cache only costs time
        return result

    return wrapper
