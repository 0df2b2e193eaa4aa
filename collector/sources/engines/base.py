"""One shape for every inference engine's metrics: a parser takes the metric families of one
/metrics scrape and returns the normalised reading (KV-cache usage ratio, requests running
and waiting, preemptions, prefix-cache hit ratio, model). Adding an engine is one new file
with a class of this shape and one line in REGISTRY (engines/__init__.py)."""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


@dataclass
class EngineReading:
    engine: str
    model: str = ""
    kv_cache_usage_ratio: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hit_ratio: float | None = None
    # Counters the hit ratio is computed from between scrapes (hits, queries), when the engine
    # exposes counters rather than a ratio.
    prefix_counters: tuple[float, float] | None = None


class ParseError(ValueError):
    """The families do not hold this engine's metrics in a usable form."""


class EngineParser(abc.ABC):
    name = ""
    prefixes: tuple[str, ...] = ()

    def matches(self, names: set[str]) -> bool:
        return any(n.startswith(self.prefixes) for n in names)

    @abc.abstractmethod
    def parse(self, families: list[Metric]) -> EngineReading:
        """The normalised reading; ParseError if the families do not hold a usable one."""


GAUGE = ("gauge", "unknown")
COUNTER = ("counter", "unknown")


def samples(families: list[Metric], *names: str, types: tuple[str, ...] = GAUGE) -> list[Sample]:
    """Every sample whose name is one of names (counters' samples keep their _total), from
    families of the expected type only: a usage ratio declared as a histogram or counter is
    not read as one (it is left absent). prometheus_client's parser hands back the samples
    of a name declared with another TYPE as untyped families of their own; those are skipped
    too."""
    wanted = set(names)
    declared = {f.name for f in families if f.type != "unknown"}
    return [
        s
        for fam in families
        if fam.type in types and not (fam.type == "unknown" and fam.name in declared)
        for s in fam.samples
        if s.name in wanted
    ]


def finite(values: Iterable[float], what: str) -> list[float]:
    out = []
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            raise ParseError(f"{what} is {v}, not a finite number")
        out.append(v)
    return out


def combined(found: list[Sample], how: Callable[[list[float]], float], what: str) -> float | None:
    """Every series of one metric (ranks, replicas) as one value, with `how` (sum, max); None
    when there is none, so the field stays absent."""
    return how(finite((s.value for s in found), what)) if found else None


def first_label(found: list[Sample], label: str) -> str:
    return next((s.labels[label] for s in found if s.labels.get(label)), "")
