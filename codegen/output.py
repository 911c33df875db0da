"""Writing generated files all at once: nothing is written unless everything rendered."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from splitformer.symbolic.errors import SplitformerError

__all__ = ["write_files"]


def write_files(files: dict[Path, str]) -> None:
    """Write every file atomically (temporary file, then rename); skip unchanged ones."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            if path.exists() and path.is_file() and path.read_text(encoding="utf-8") == text:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
                stream.write(text)
            staged.append((temporary, path))
        for temporary, path in staged:
            os.replace(temporary, path)
    except OSError as error:
        for temporary, _ in staged:
            if os.path.exists(temporary):
                os.unlink(temporary)
        raise SplitformerError(f"cannot write {error.filename}: {error.strerror}") from None
