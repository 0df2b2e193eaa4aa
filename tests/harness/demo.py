"""`gpufleet demo` as a person runs it, in a home of its own: started, waited on until it says it
is ready, stopped with Ctrl-C (SIGINT) and required to exit 0."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.processes import gpufleet_argv, home_env
from harness.waiting import wait_until

READY_LINE = "Ctrl-C stops the demo"


@contextmanager
def running_demo(
    home: Path, *args: str, name: str = "demo", ready_s: float = 120
) -> Iterator[dict[str, str]]:
    """The demo with args, HOME in home; yields the environment the CLI beside it uses. Its
    output is in home/NAME.out (the failure message quotes it)."""
    env = home_env(home)
    out = home / f"{name}.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(gpufleet_argv("demo", *args), stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(
            lambda: proc.poll() is None and READY_LINE in out.read_text(),
            ready_s,
            f"the {name} to be ready (its output: {out})",
        )
        yield env
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.read_text()[-4000:]
