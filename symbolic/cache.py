"""A disk cache for pure, slow derivations, that can neither run code nor change a result.

Entries live in ``$SPLITFORMER_CACHE`` (default ``~/.cache/splitformer``, also for ``on``, ``1``,
``true`` or ``yes``; ``off``, ``0``, ``false`` or ``no`` disables the cache; any other value is a
folder, a relative one taken from the current folder). Each entry is a JSON document (``expression_json`` trees for SymPy values),
keyed by the entry format, the generator version, the SymPy version and a hash of the
sources of the deriving package. Loading an entry runs nothing: JSON is parsed, expressions
are rebuilt from a fixed table of operations, and the value is handed to the function's
*verifier*, which re-checks it against the conditions that define it. Whatever cannot be
read, decoded or verified (or written) falls back to deriving, with one warning line on
stderr at most per process.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sympy as sp

from .expression_json import from_json, to_json

__all__ = ["disk_cached", "cache_folder", "CacheUnusable"]

T = TypeVar("T")

#: Version of the entry layout below; part of every key.
FORMAT = 1
#: Entries are small (a few kB); anything larger is not ours.
MAX_ENTRY_BYTES = 1 << 20

_warned = False


class CacheUnusable(Exception):
    """The cache cannot be used (no folder, unreadable entry, failed verification)."""


def _warn_once(message: str) -> None:
    """One line on stderr (a character that is not printable written as its escape, as error lines write it); a
    stderr that cannot take it (full, closed) drops it: a warning never fails the derivation."""
    global _warned
    if not _warned:
        _warned = True
        shown = "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
                        for char in message[:400])
        if sys.stderr is None:  # started with it closed (2>&-): print(file=None) would write to stdout
            return
        try:
            print(f"splitformer: warning: {shown}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # full, or closed since
            pass


#: ``SPLITFORMER_CACHE`` spellings (any case) that switch the cache off, and those that ask for the default folder.
OFF = frozenset({"off", "0", "false", "no"})
ON = frozenset({"", "on", "1", "true", "yes"})


def cache_folder() -> Path | None:
    """The cache folder (``$SPLITFORMER_CACHE``: ``OFF``, ``ON`` for the default, else a folder, ``~`` the home
    folder, a relative one from the current folder), or ``None`` when caching is off; ``CacheUnusable`` without a home folder."""
    setting = os.environ.get("SPLITFORMER_CACHE", "")
    if setting.strip().lower() in OFF:
        return None
    try:
        if setting.strip().lower() not in ON:
            return Path(setting).expanduser()  # '~/cache' quoted past the shell is the home folder's, not a folder '~'
        return Path.home() / ".cache" / "splitformer"
    except (RuntimeError, KeyError, OSError, ValueError):  # no such user, no home folder
        where = ("no home folder to hold the derivation cache" if setting.strip().lower() in ON else
                 f"SPLITFORMER_CACHE={setting[:80]!r}: its '~' names no home folder")
        raise CacheUnusable(f"{where}; set SPLITFORMER_CACHE") from None


def _sources(function: Callable) -> str:
    """The source of every module in the package that defines ``function`` (what it may call)."""
    try:
        folder = Path(inspect.getfile(inspect.getmodule(function))).parent
        return "\0".join(path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.py")))
    except (OSError, TypeError, UnicodeDecodeError):
        raise CacheUnusable(f"the source of {function.__qualname__} is not available") from None


def _key(function: Callable) -> str:
    from . import __version__

    parts = (str(FORMAT), __version__, sp.__version__, function.__qualname__, _sources(function))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def entry_path(function: Callable) -> Path | None:
    """Where the entry of ``function`` lives (``None`` when caching is off)."""
    folder = cache_folder()
    return None if folder is None else folder / f"{function.__name__}-{_key(function)}.json"


def _encode(value: Any) -> Any:
    if isinstance(value, sp.Basic):
        return {"sympy": to_json(value)}
    if isinstance(value, (tuple, list)):
        return {"tuple": [_encode(item) for item in value]}
    if value is None or isinstance(value, (str, bool, int)):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in the cache")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"sympy"}:
            return from_json(value["sympy"])
        if set(value) == {"tuple"} and isinstance(value["tuple"], list):
            return tuple(_decode(item) for item in value["tuple"])
        raise ValueError("unknown value in cache entry")
    if value is None or isinstance(value, (str, bool, int)):
        return value
    raise ValueError(f"unexpected {type(value).__name__} in cache entry")


def _document(function: Callable, value: Any) -> str:
    fields = {field.name: _encode(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return json.dumps({"format": FORMAT, "function": function.__qualname__, "key": _key(function), "fields": fields},
                      sort_keys=True)


def _read(path: Path, function: Callable, result_type: type[T], verify: Callable[[T], None]) -> T:
    """The verified value stored at ``path``; ``FileNotFoundError`` or ``CacheUnusable`` otherwise."""
    try:
        # non-blocking, so that a FIFO planted in the folder cannot stall the run
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise ValueError("not a regular file")
            data = stream.read(MAX_ENTRY_BYTES + 1)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as error:
        raise CacheUnusable(f"cannot read the cache entry {path}: {getattr(error, 'strerror', None) or error}") from None
    try:
        if len(data) > MAX_ENTRY_BYTES:
            raise ValueError(f"larger than {MAX_ENTRY_BYTES} bytes")
        document = json.loads(data.decode("utf-8"))
        if not isinstance(document, dict) or document.get("format") != FORMAT or \
                document.get("function") != function.__qualname__ or document.get("key") != _key(function):
            raise ValueError("not an entry of this derivation")
        fields = document.get("fields")
        if not isinstance(fields, dict) or set(fields) - {field.name for field in dataclasses.fields(result_type)}:
            raise ValueError(f"not a {result_type.__name__}")
        value = result_type(**{name: _decode(item) for name, item in fields.items()})
        verify(value)
    except Exception as error:  # noqa: BLE001 - whatever fails to decode or verify is unusable
        raise CacheUnusable(f"ignored the cache entry {path}: {type(error).__name__}: {error}") from None
    return value


def _write(path: Path, function: Callable, value: Any) -> None:
    try:
        text = _document(function, value)
    except TypeError as error:
        raise CacheUnusable(f"cannot cache {function.__qualname__}: {error}") from None
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{function.__name__}-", suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException as error:  # an interrupt too: never leave a temporary behind
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
        if not isinstance(error, (OSError, ValueError)):
            raise
        raise CacheUnusable(f"cannot write the derivation cache at {path.parent}: "
                            f"{getattr(error, 'strerror', None) or error}") from None


def disk_cached(result_type: type[T], verify: Callable[[T], None]) -> Callable[[Callable[[], T]], Callable[[], T]]:
    """Cache a pure function without arguments (returning a ``result_type`` dataclass) in memory and on disk.

    ``verify(value)`` must raise when ``value`` does not satisfy the conditions that define the
    function's result; a cached value reaches the caller only after it passed.
    """

    def decorate(function: Callable[[], T]) -> Callable[[], T]:
        def load_or_derive() -> T:
            path = None
            try:
                path = entry_path(function)
                if path is not None:
                    return _read(path, function, result_type, verify)
            except FileNotFoundError:
                pass
            except CacheUnusable as reason:
                _warn_once(f"{reason}; deriving instead")
            result = function()
            if path is not None:
                try:
                    _write(path, function, result)
                except CacheUnusable as reason:
                    _warn_once(str(reason))
            return result

        wrapper = functools.cache(load_or_derive)
        functools.update_wrapper(wrapper, function)
        wrapper.entry_path = functools.partial(entry_path, function)
        return wrapper

    return decorate
