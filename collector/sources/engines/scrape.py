"""Scrape inference-engine /metrics endpoints and normalise them to EngineSample.

An endpoint that is down, slow, answers an HTTP error, garbage, no known engine metrics or
implausible values is reported as unreadable with the reason — the report still goes out,
and the collector carries on. Endpoints are scraped concurrently, each with a timeout, so
one hanging engine never delays sampling by more than that timeout.

Endpoint list (collector setting `engines`): entries separated by ';', each a URL with an
optional `gpus=0,1` naming the NVML GPU indices the engine runs on and an optional `pool=NAME`
naming the serving pool it is in (where one model is served by two deployments that must be
weighed apart; without it a replica is in the pool of its model):
    http://127.0.0.1:8000/metrics gpus=0,1,2,3 pool=llama-prod; http://127.0.0.1:30000/metrics gpus=4
"""

from __future__ import annotations

import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.sources.engines import REGISTRY, EngineReading, ParseError
from gpufleet.protos import telemetry_pb2
from gpufleet.protos.names import POOL_NAME_RE, POOL_NAME_RULE, UNKNOWN_ENGINE_MODEL

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_REMEMBERED = 1024  # endpoints whose last engine and model are kept (discovery can find many)


@dataclass(frozen=True)
class Endpoint:
    url: str
    gpus: tuple[int, ...] = ()
    pool: str = ""  # the serving pool it is in ("": its model's)


def parse_endpoints(text: str) -> list[Endpoint]:
    """'URL [gpus=0,1]; URL ...' -> endpoints; ValueError naming the bad entry."""
    endpoints = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        url, *options = entry.split()
        parts = urllib.parse.urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"engine endpoint {url!r} is not an http(s) URL")
        gpus: tuple[int, ...] = ()
        pool = ""
        for option in options:
            key, _, value = option.partition("=")
            if key == "pool":
                if not POOL_NAME_RE.fullmatch(value):
                    raise ValueError(
                        f"engine endpoint {url!r}: pool={value!r} is no pool name ({POOL_NAME_RULE})"
                    )
                pool = value
                continue
            if key != "gpus":
                raise ValueError(
                    f"engine endpoint {url!r}: unknown option {option!r}; known: gpus=0,1,... and pool=NAME"
                )
            try:
                gpus = tuple(int(g) for g in value.split(",") if g)
            except ValueError:
                raise ValueError(
                    f"engine endpoint {url!r}: gpus={value!r} is not a list of GPU indices"
                ) from None
        endpoints.append(Endpoint(url, gpus, pool))
    return endpoints


class EngineScraper:
    def __init__(self, endpoints: list[Endpoint], timeout_s: float = 2.0) -> None:
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self._previous_prefix: dict[str, tuple[float, float]] = {}
        # Each URL's engine and model when last read: a replica that stops answering is still
        # reported as what it served, so it counts as out of its pool, not as a stranger.
        self._last_known: dict[str, tuple[str, str]] = {}
        self.failed_total = 0  # unreadable scrapes, for the collector's own health
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="engine-scrape")

    def scrape_all(self, extra: list[Endpoint] = ()) -> list[telemetry_pb2.EngineSample]:
        """Scrape the configured endpoints plus `extra` (discovered) ones; a URL configured
        by hand wins over the same URL discovered."""
        configured = {e.url for e in self.endpoints}
        endpoints = self.endpoints + [e for e in extra if e.url not in configured]
        return list(self._pool.map(self.scrape, endpoints))

    def scrape(self, endpoint: Endpoint) -> telemetry_pb2.EngineSample:
        sample = telemetry_pb2.EngineSample(
            endpoint=endpoint.url,
            gpu_indices=endpoint.gpus,
            port=urllib.parse.urlparse(endpoint.url).port or 80,
            pool=endpoint.pool,
        )
        try:
            reading = self._read(endpoint.url)
        except Unreadable as exc:
            self.failed_total += 1
            sample.readable = False
            sample.unreadable_reason = str(exc)
            engine, model = self._last_known.get(endpoint.url, (UNKNOWN_ENGINE_MODEL, UNKNOWN_ENGINE_MODEL))
            sample.engine = exc.engine or engine
            sample.model = model
            return sample
        sample.readable = True
        sample.engine = reading.engine
        sample.model = reading.model or UNKNOWN_ENGINE_MODEL
        if len(self._last_known) < MAX_REMEMBERED or endpoint.url in self._last_known:
            self._last_known[endpoint.url] = (sample.engine, sample.model)
        for name in (
            "kv_cache_usage_ratio",
            "requests_running",
            "requests_waiting",
            "preemptions_total",
            "prefix_cache_hit_ratio",
        ):
            value = getattr(reading, name)
            if value is not None:
                setattr(sample, name, value)
        return sample

    def _read(self, url: str) -> EngineReading:
        text = fetch(url, self.timeout_s)
        try:
            families = list(text_string_to_metric_families(text))
        except (ValueError, IndexError, TypeError) as exc:
            raise Unreadable(f"{url} answered text that is not Prometheus exposition format: {exc}") from exc
        names = {f.name for f in families} | {s.name for f in families for s in f.samples}
        parser = next((p for p in REGISTRY.values() if p.matches(names)), None)
        if parser is None:
            known = ", ".join(p for parser in REGISTRY.values() for p in parser.prefixes)
            raise Unreadable(f"{url} exposes no metrics of a known engine (names starting {known})")
        try:
            reading = parser.parse(families)
        except ParseError as exc:
            raise Unreadable(f"{url} ({parser.name}): {exc}", parser.name) from exc
        if reading.prefix_counters is not None:
            reading.prefix_cache_hit_ratio = self._hit_ratio(url, *reading.prefix_counters)
        _check(reading, url)
        return reading

    def _hit_ratio(self, url: str, hits: float, queries: float) -> float | None:
        """Hits over queries since the previous scrape (since start on the first one)."""
        before = self._previous_prefix.get(url)
        self._previous_prefix[url] = (hits, queries)
        if before and queries >= before[1] and hits >= before[0]:
            d_hits, d_queries = hits - before[0], queries - before[1]
            return d_hits / d_queries if d_queries > 0 else None
        return hits / queries if queries > 0 else None  # first scrape, or the engine restarted

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Unreadable(Exception):
    """An endpoint could not be read as an engine's metrics; the message says why."""

    def __init__(self, reason: str, engine: str = "") -> None:
        super().__init__(reason)
        self.engine = engine


def fetch(url: str, timeout_s: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise Unreadable(f"{url} answered HTTP {exc.code} {exc.reason}") from exc
    except TimeoutError as exc:
        raise Unreadable(f"{url} did not answer within {timeout_s:g} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError | socket.timeout):
            raise Unreadable(f"{url} did not answer within {timeout_s:g} s") from exc
        raise Unreadable(f"cannot connect to {url}: {exc.reason}") from exc
    except OSError as exc:
        raise Unreadable(f"reading {url} failed: {exc}") from exc
    if len(body) > MAX_BODY_BYTES:
        raise Unreadable(f"{url} answered more than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def _check(reading: EngineReading, url: str) -> None:
    """Implausible values make the engine unreadable here, rather than the whole report
    being rejected at the aggregator."""
    for name in ("kv_cache_usage_ratio", "prefix_cache_hit_ratio"):
        value = getattr(reading, name)
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
            raise Unreadable(f"{url} ({reading.engine}): {name}={value} is outside 0..1", reading.engine)
    for name in ("requests_running", "requests_waiting", "preemptions_total"):
        value = getattr(reading, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise Unreadable(
                f"{url} ({reading.engine}): {name}={value} is negative or not finite", reading.engine
            )
