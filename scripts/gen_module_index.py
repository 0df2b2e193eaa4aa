"""Write the module index of docs/architecture.md: every module of the product, each with the first
sentence of its own docstring, between the module-index markers.

    python scripts/gen_module_index.py            # rewrite the index in docs/architecture.md
    python scripts/gen_module_index.py --check    # exit 1 if it is out of date

The index is generated so that it cannot drift: tests/project/test_layout.py runs the check, and
the module docstrings stay the one place a module says what it is for.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
START, END = "<!-- module-index:start -->", "<!-- module-index:end -->"
# The folders that make the product (the wheel's gpufleet.<folder>); tests, bench and scripts are not.
PRODUCT = ("protos", "common", "collector", "aggregator", "repair", "client", "dashboard", "cli")


def modules() -> list[Path]:
    found = []
    for folder in PRODUCT:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            found.append(path.relative_to(REPO))
    return found


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse((REPO / path).read_text())) or ""
    text = " ".join(doc.split())
    match = re.match(r"(.+?[.:])(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence.rstrip(":.").replace("|", "\\|") or "(no docstring)"


def index() -> str:
    rows = ["| module | what it is for (its docstring's first sentence) |", "|---|---|"]
    rows += [f"| `{path.as_posix()}` | {first_sentence(path)} |" for path in modules()]
    return "\n".join(rows)


def rewritten(text: str) -> str:
    start, end = text.index(START) + len(START), text.index(END)
    return f"{text[:start]}\n{index()}\n{text[end:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the index is out of date")
    args = parser.parse_args()
    text = DOC.read_text()
    new = rewritten(text)
    if args.check:
        if new != text:
            print(f"{DOC}: the module index is out of date; run scripts/gen_module_index.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    print(f"wrote the module index of {DOC} ({len(modules())} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
