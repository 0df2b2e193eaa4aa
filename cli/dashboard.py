"""`gpufleet dashboard`: serve dashboard/app.py with Streamlit, headless."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


def run_dashboard(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        print(
            "gpufleet dashboard: Streamlit is not installed; pip install 'gpufleet[dashboard]'",
            file=sys.stderr,
        )
        return 2
    spec = importlib.util.find_spec("gpufleet.dashboard.app")
    assert spec and spec.origin
    env = dict(os.environ)
    if args.fleet:
        env["GPUFLEET_FLEET"] = args.fleet
    if args.token:
        env["GPUFLEET_TOKEN"] = args.token
    if args.token_file:
        env["GPUFLEET_TOKEN"] = Path(args.token_file).read_text().strip()
    argv = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        spec.origin,
        "--server.port",
        str(args.port),
        "--server.address",
        args.address,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # Streamlit's "Deploy" button and developer menu are for an app's author, not an SRE.
        "--client.toolbarMode",
        "minimal",
    ]
    # exec, not a child process: a supervisor's SIGTERM then reaches Streamlit itself
    # instead of orphaning it.
    os.execve(sys.executable, argv, env)
