"""The ingest area's fixtures: a real filesystem small enough to fill (the full-disk faults)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 24 MiB tmpfs for the data directory, mounted for this test only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the full-disk test needs root (CI runs as root)")
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
