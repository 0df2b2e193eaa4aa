"""What users install: the built wheel and the image's build steps, each in a clean virtual
environment (no editable install, the repository not on sys.path), running the product.

- The wheel and the sdist are built as `pip install` would (an isolated build); the wheel holds
  every module of every package folder (setup.py maps them whole); installed into a fresh venv
  with its extras, every module under `gpufleet` imports, and `gpufleet demo` and
  `gpufleet replay --generate llama3` run from it.
- No container builder runs on this machine (Docker's client, no engine; docs/testing.md), so
  deploy/Dockerfile's build stage is replayed: its `COPY . .` (less .dockerignore) into a fresh
  folder, its RUN line with the image's paths under a temporary root, then its ENTRYPOINT and
  CMD, and the aggregator it installed serving on loopback.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.paths import REPO
from harness.waiting import wait_until

EXTRAS = "dashboard,kubernetes,postgresql"
# --no-compile: byte-compiling the ~6,000 modules pip installs was half of pip's CPU here (15 of
# 31 s, measured), and nothing these tests check: Python compiles what it imports. The image
# itself keeps pip's default (deploy/Dockerfile).
PIP_FLAGS = ("--disable-pip-version-check", "-q", "--no-compile")


def run(argv: list[str], cwd: Path, timeout_s: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "PYTHON", "VIRTUAL_ENV"))}
    out = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env={**clean, **env}
    )
    assert out.returncode == 0, (
        f"{shlex.join(argv)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out


def package_modules() -> set[str]:
    """Every Python module of every package folder, as `gpufleet.<folder>....` names."""
    found = set()
    for init in REPO.glob("*/__init__.py"):
        for path in init.parent.rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add("gpufleet/" + path.relative_to(REPO).as_posix())
    return found


def source_files() -> list[str]:
    """The checkout's files as a clone would have them (tracked, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [rel for rel in listed if (REPO / rel).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel, built from a copy of the checkout's files: `python -m build` in the
    checkout itself walks a tree that the other test workers write bytecode into (a .pyc's
    temporary file gone before the walk reached it failed the sdist: 'No such file or
    directory', twice), and it writes build/ and *.egg-info there."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for rel in source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(src)], src)
    return out


# The two tests of the built wheel share one worker, so it is built once (apart, each worker built
# its own: 20 s of a worker and ~4 s of CPU twice).
@pytest.mark.xdist_group("built-wheel")
def test_the_wheel_holds_every_module_and_its_data(built: Path) -> None:
    (wheel,) = built.glob("gpufleet-*.whl")
    (sdist,) = built.glob("gpufleet-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = package_modules() - names
    assert not missing, f"the wheel lacks {sorted(missing)[:10]}"
    for data in ("protos/fleet.proto", "repair/default_policy.toml", "repair/replay/llama3_table5.csv"):
        assert f"gpufleet/{data}" in names, data
    assert not any(n.startswith(("tests/", "gpufleet/tests/", "bench/")) for n in names)
    assert sdist.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.xdist_group("built-wheel")
def test_the_installed_wheel_runs_the_product(built: Path, tmp_path: Path) -> None:
    (wheel,) = built.glob("gpufleet-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py, gpufleet = venv / "bin" / "python", venv / "bin" / "gpufleet"
    run([str(py), "-m", "pip", "install", *PIP_FLAGS, f"{wheel}[{EXTRAS}]"], tmp_path)
    # Every module imports from the installed package (the dashboard's app.py is the page
    # script `streamlit run` executes, not a module to import).
    walk = (
        "import importlib, pkgutil, gpufleet, json\n"
        "mods = sorted(m.name for m in pkgutil.walk_packages(gpufleet.__path__, 'gpufleet.'))\n"
        "skip = {'gpufleet.dashboard.app'}\n"
        "for m in mods:\n"
        "    if m not in skip: importlib.import_module(m)\n"
        "replay = importlib.import_module('gpufleet.repair.replay')\n"
        "print(json.dumps({'count': len(mods), 'file': replay.__file__}))\n"
    )
    got = json.loads(run([str(py), "-c", walk], tmp_path).stdout)
    assert got["count"] >= len(package_modules()) - 20, got  # __init__ modules are packages
    assert str(venv) in got["file"] and str(REPO) not in got["file"], "imported from the checkout"
    home = tmp_path / "home"
    demo = run(
        [
            str(gpufleet),
            "demo",
            "--nodes",
            "2",
            "--duration",
            "20",
            "--no-dashboard",
            "--data-dir",
            str(tmp_path / "demo"),
        ],
        tmp_path,
        timeout_s=180,
        HOME=str(home),
    )
    assert "gpufleet demo is running: 2 nodes" in demo.stdout, demo.stdout
    replay = run(
        [str(gpufleet), "replay", "--generate", "llama3", "--nodes", "64", "--days", "2"],
        tmp_path,
        HOME=str(home),
    )
    assert "replay of generated llama3 Table 5 mix" in replay.stdout and "nodes taken out" in replay.stdout


def _dockerignored(path: str, patterns: list[str]) -> bool:
    return any(
        fnmatch.fnmatch(path, p)
        or fnmatch.fnmatch(path, f"{p}/*")
        or fnmatch.fnmatch(path, f"*/{p.lstrip('*/')}/*")
        for p in patterns
    )


@pytest.mark.slow
def test_the_image_build_steps_run_in_a_clean_venv(tmp_path: Path) -> None:
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip(
            "a Docker engine runs here: build the image itself instead"
        )  # not on this kind of machine
    lines = [ln.strip() for ln in (REPO / "deploy" / "Dockerfile").read_text().splitlines()]
    build_stage = lines[
        : next(i for i, ln in enumerate(lines) if ln.startswith("FROM") and i > 0 and "AS build" not in ln)
    ]
    assert "COPY . ." in build_stage, "the build stage copies the whole context"
    workdir = next(ln.split()[1] for ln in build_stage if ln.startswith("WORKDIR"))
    image_root = tmp_path / "image"
    src = image_root / workdir.lstrip("/")
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    for rel in source_files():
        if not _dockerignored(rel, patterns):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    assert not (src / "tests").exists() and (src / "setup.py").exists()
    # The RUN line (continuations joined), its absolute paths under the temporary root.
    start = next(i for i, ln in enumerate(build_stage) if ln.startswith("RUN "))
    command = ""
    for ln in build_stage[start:]:
        command += ln.rstrip("\\").strip() + " "
        if not ln.endswith("\\"):
            break
    command = command[len("RUN ") :].replace("/opt/gpufleet", str(image_root / "opt" / "gpufleet"))
    command = command.replace("python -m venv", f"{sys.executable} -m venv").replace("--no-cache-dir", "")
    command = command.replace("pip install", "pip install --no-compile")  # PIP_FLAGS
    run(["sh", "-c", command], src)
    entry = json.loads(next(ln for ln in lines if ln.startswith("ENTRYPOINT")).split(None, 1)[1])
    cmd = json.loads(next(ln for ln in lines if ln.startswith("CMD")).split(None, 1)[1])
    binary = image_root / "opt" / "gpufleet" / "bin" / entry[0]
    helped = run([str(binary), *cmd], tmp_path)
    for command_name in ("aggregator", "collector", "dashboard", "gpu-reset-helper", "replay"):
        assert command_name in helped.stdout, command_name
    # The aggregator the image would run, serving (loopback here; TLS in the deploy files).
    secrets, ready = tmp_path / "secrets.toml", tmp_path / "ready.json"
    run([str(binary), "auth", "init", "--secrets", str(secrets), "--viewer", "v"], tmp_path)
    proc = subprocess.Popen(
        [str(binary), "aggregator", "run", "--data-dir", str(tmp_path / "data"),
         "--secrets-file", str(secrets), "--ingest-listen", "127.0.0.1:0", "--fleet-listen", "127.0.0.1:0",
         "--metrics-listen", "", "--ready-file", str(ready)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the image's aggregator to serve")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        proc.terminate()
        proc.wait(30)
