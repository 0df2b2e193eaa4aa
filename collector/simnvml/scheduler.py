"""The demo's scheduler, as the simulated nodes see it: one small file per node that the demo's
operator commands write (collector/simnvml/serving.py Control: cordon, evict, uncordon) and the
node's simulated jobs obey (machine.py SimulatedNode): no job starts on a cordoned node, a
drained node's job is stopped, and work starts again when the node is back in service. A file,
not a socket: the collector reads it once per simulated second, and a demo that stopped leaves
nothing listening."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

log = logging.getLogger("gpufleet.collector.sim")

IN_SERVICE = ""
CORDONED = "cordoned"
# Cordoned, and its inference engines out of rotation (the drain's first step, before it
# evicts): no request reaches them, those in flight finish (engine_server.py).
OUT_OF_ROTATION = "out_of_rotation"
DRAINED = "drained"
STATES = (IN_SERVICE, CORDONED, OUT_OF_ROTATION, DRAINED)


class ScheduledState:
    """One node's state in the demo's scheduler, read from its file (absent: in service)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.unreadable_total = 0  # reads that failed other than "no file" (said once)

    def read(self) -> str:
        try:
            state = self.path.read_text().strip()
        except FileNotFoundError:
            return IN_SERVICE
        except OSError as exc:
            self.unreadable_total += 1
            if self.unreadable_total == 1:
                log.warning(
                    "cannot read the demo scheduler's state %s: %s; treated as in service", self.path, exc
                )
            return IN_SERVICE
        return state if state in STATES else IN_SERVICE

    def write(self, state: str) -> None:
        """Set the state (the operator command's side): written whole, then renamed into place."""
        if state not in STATES:
            raise ValueError(f"scheduler state {state!r} must be one of {STATES}")
        if state == IN_SERVICE:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(self.path.name + ".part")
        part.write_text(state + "\n")
        os.replace(part, self.path)


class ServedLoad:
    """What a demo node's inference replica asks of its GPUs, in a file beside its scheduler
    state (`NODE.serving`), written by the demo's serving pool (cli/demo_serving.py) each time it
    changes and read by the node (machine.py): its GPUs are as busy as its batch is full, and it
    holds the HBM vLLM takes at start (the weights and the preallocated KV-cache). No file: the
    node serves nothing and runs its own jobs."""

    def __init__(self, scheduler_file: str | Path) -> None:
        self.path = Path(str(scheduler_file) + ".serving")
        self.unreadable_total = 0

    def read(self) -> tuple[float, float] | None:
        """(GPU utilization %, HBM fraction held), or None when the node serves nothing."""
        try:
            data = json.loads(self.path.read_text())
            util, hbm = float(data["util_pct"]), float(data["hbm_fraction"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.unreadable_total += 1
            if self.unreadable_total == 1:
                log.warning(
                    "cannot read the demo's serving load %s: %s; the node runs its own jobs", self.path, exc
                )
            return None
        if not (math.isfinite(util) and math.isfinite(hbm)):
            return None
        return min(100.0, max(0.0, util)), min(1.0, max(0.0, hbm))

    def write(self, util_pct: float, hbm_fraction: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(self.path.name + ".part")
        part.write_text(json.dumps({"util_pct": util_pct, "hbm_fraction": hbm_fraction}) + "\n")
        os.replace(part, self.path)
