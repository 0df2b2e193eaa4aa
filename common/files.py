"""Files that hold secrets: written whole or not at all, readable by their owner only."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: str | Path, text: str) -> Path:
    """Replace path with text, mode 0600 whatever the file's mode was before: the text goes to a
    new file in the same folder (created 0600, fsynced) that is then renamed over path, so a
    reader never sees half a file and a file that was 0644 does not stay 0644."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def append_private(path: str | Path, text: str) -> Path:
    """Add text to the end of path, rewritten as write_private does (mode 0600)."""
    path = Path(path)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    return write_private(path, old + text)
