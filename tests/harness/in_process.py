"""The aggregator run inside the test process, for tests that add a plug-in of their own."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.aggregator.auth.tokens import new_secrets_file
from harness.processes import AggregatorHandle, Secrets


class InProcessAggregator:
    """A real Aggregator (real gRPC servers on loopback, real store) run on its own event loop in
    a thread of the test process, so a test can add a faulty plug-in of its own (a listener that
    raises) before it starts. Everything else is what `gpufleet aggregator run` runs."""

    def __init__(self, tmp: Path, prepare: Callable[[Any], None] | None = None, **settings: Any) -> None:
        import asyncio
        import threading

        from gpufleet.aggregator.config import AggregatorConfig
        from gpufleet.aggregator.server import Aggregator

        self.secrets_path = tmp / "secrets.toml"
        tokens = new_secrets_file(self.secrets_path, [("ops", "operator"), ("viewer", "viewer")])
        secret = tomllib.loads(self.secrets_path.read_text())["collector_secret"]
        self.secrets = Secrets(self.secrets_path, secret, tokens)
        config = AggregatorConfig(
            data_dir=str(tmp / "data"),
            secrets_file=str(self.secrets_path),
            ingest_listen="127.0.0.1:0",
            fleet_listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            # Tests read counters as they change, polling: computed for each scrape, unpaced.
            **{"metrics_snapshot_s": 0.0, "metrics_max_scrapes_per_s": 0.0, **settings},
        )
        self.loop = asyncio.new_event_loop()
        started: dict[str, Any] = {}
        ready = threading.Event()

        async def main() -> None:
            try:
                agg = Aggregator(config)
                if prepare is not None:
                    prepare(agg)
                started["bound"] = await agg.start()
                started["aggregator"] = agg
                stop = started["stop"] = asyncio.Event()
                agg.run_background(stop)
            except BaseException as exc:
                started["error"] = exc
                raise
            finally:
                ready.set()
            await stop.wait()
            await agg.wait_loops()
            await agg.stop()

        self._thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self._thread.start()
        if not ready.wait(30) or "error" in started:
            raise AssertionError(f"the in-process aggregator did not start: {started.get('error')}")
        self.aggregator = started["aggregator"]
        self._stop = started["stop"]
        bound = started["bound"]
        self.ingest, self.fleet, self.metrics = bound.ingest, bound.fleet, bound.metrics
        self.data_dir = tmp / "data"

    def metric_value(self, name: str, **labels: str) -> float:
        return AggregatorHandle.metric_value(self, name, **labels)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
