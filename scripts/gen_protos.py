"""Regenerate the Python code in protos/ from the .proto files there.

    python scripts/gen_protos.py            # rewrite protos/*_pb2*.py
    python scripts/gen_protos.py --check    # exit 1 if the committed code is out of date

The .proto files are mapped to the import path `gpufleet/v1/`; the generated modules are
rewritten to import each other as `gpufleet.protos.x_pb2`, matching how the package is
installed.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

PROTOS_DIR = Path(__file__).resolve().parent.parent / "protos"
# The .proto files are registered in protobuf's global descriptor pool under this path,
# so they cannot collide with another library's "telemetry.proto".
IMPORT_PREFIX = "gpufleet/v1"


def generate(out_dir: Path, protos_dir: Path = PROTOS_DIR) -> list[Path]:
    """Run protoc (from grpcio-tools) into out_dir; return the generated files."""
    import importlib.resources

    from grpc_tools import protoc  # dev dependency, imported only when generating

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    protos = sorted(protos_dir.glob("*.proto"))
    args = [
        "protoc",
        f"-I{IMPORT_PREFIX}={protos_dir}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[f"{IMPORT_PREFIX}/{p.name}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    gen_dir = out_dir / IMPORT_PREFIX
    generated = sorted(p for p in gen_dir.iterdir() if p.suffix in (".py", ".pyi"))
    package = IMPORT_PREFIX.replace("/", ".")
    for path in generated:
        # protoc writes `from gpufleet.v1 import x_pb2`; the modules are installed as
        # gpufleet.protos.x_pb2.
        path.write_text(path.read_text().replace(f"from {package} import ", "from gpufleet.protos import "))
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument(
        "--protos-dir",
        type=Path,
        default=PROTOS_DIR,
        help="folder with the .proto files and their generated code",
    )
    args = parser.parse_args()
    protos_dir: Path = args.protos_dir.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp), protos_dir)
        stale: list[str] = []
        for path in generated:
            target = protos_dir / path.name
            new = path.read_text()
            old = target.read_text() if target.exists() else ""
            if new == old:
                continue
            if args.check:
                diff = difflib.unified_diff(
                    old.splitlines(), new.splitlines(), str(target), "regenerated", lineterm=""
                )
                stale.append("\n".join(list(diff)[:40]))
            else:
                target.write_text(new)
                print(f"wrote {target}")
        if args.check and stale:
            print(
                "protos/ generated code does not match the .proto files; run "
                "`python scripts/gen_protos.py`:\n" + "\n\n".join(stale),
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
