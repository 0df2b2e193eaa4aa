"""How the wheel is made of the project's folders (docs/architecture.md "Packaging").

The code lives in the top-level folders the project was specified with (collector/,
aggregator/, repair/, ...), and imports as `gpufleet.<folder>`. Every top-level folder holding
an `__init__.py` is installed as `gpufleet.<folder>` whole: every folder under it is a package
(with or without its own `__init__.py`) and every file that is not Python is package data. No
list of subpackages or data files is kept by hand, so a new folder cannot be left out of the
wheel (a test builds the wheel and imports every module from a clean install).

setuptools rather than hatchling: hatchling's `sources` option maps folders to a prefix, but
cannot install such a layout in editable mode (pfmoore/editables#20), which the tests and the
two README commands use.
"""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
PREFIX = "gpufleet"
SKIP = {"__pycache__"}


def folders() -> list[str]:
    """The top-level folders that are packages (tests/, bench/, docs/, ... hold no __init__.py)."""
    return sorted(d.name for d in ROOT.iterdir() if d.is_dir() and (d / "__init__.py").is_file())


def layout() -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    package_data: dict[str, list[str]] = {}
    for folder in folders():
        package_dir[f"{PREFIX}.{folder}"] = folder
        subpackages = find_namespace_packages(folder, exclude=["*__pycache__*", "__pycache__"])
        for name in ["", *subpackages]:
            package = f"{PREFIX}.{folder}" + (f".{name}" if name else "")
            packages.append(package)
            where = ROOT / folder / name.replace(".", "/")
            data = sorted(
                p.name
                for p in where.iterdir()
                if p.is_file() and p.suffix not in (".py", ".pyc") and p.name not in SKIP
            )
            if data:
                package_data[package] = data
    return packages, package_dir, package_data


def version() -> str:
    text = (ROOT / "common" / "version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if match is None:
        raise SystemExit("common/version.py holds no __version__")
    return match.group(1)


packages, package_dir, package_data = layout()
setup(version=version(), packages=packages, package_dir=package_dir, package_data=package_data)
