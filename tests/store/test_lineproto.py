"""Line-protocol escaping (InfluxDB's rules) and the caching encoder that must not change it."""

from __future__ import annotations

import pytest

from gpufleet.aggregator.store import Point
from gpufleet.aggregator.store.lineproto import LineEncoder, influxql_string, line

T = 1_790_000_040_000_000_000


@pytest.mark.parametrize(
    "point,expected",
    [
        (
            Point("gpu", {"node": "n1", "gpu": "0"}, {"util_gpu_pct": 1.5, "seq": 7, "lost": False}, T),
            f"gpu,gpu=0,node=n1 util_gpu_pct=1.5,seq=7i,lost=false {T}",
        ),
        (
            Point("gpu", {"node": "rack 3,node=7", "model": "NVIDIA H100 80GB HBM3"}, {"x": 1.0}, T),
            f"gpu,model=NVIDIA\\ H100\\ 80GB\\ HBM3,node=rack\\ 3\\,node\\=7 x=1.0 {T}",
        ),
        (
            Point("event", {"node": "α-1", "gpu": ""}, {"message": 'said "hi" \\ bye', "xid": 79}, T),  # noqa: RUF001 (unicode on purpose)
            f'event,node=α-1 message="said \\"hi\\" \\\\ bye",xid=79i {T}',  # noqa: RUF001
        ),
        (
            Point("my measurement,x", {"k": "v"}, {"field key=": True}, T),
            f"my\\ measurement\\,x,k=v field\\ key\\==true {T}",
        ),
    ],
    ids=["types", "spaces-commas-equals", "quotes-unicode-empty-tag", "odd-names"],
)
def test_escaping_and_types(point: Point, expected: str) -> None:
    assert line(point) == expected
    assert LineEncoder().line(point) == expected


def test_the_caching_encoder_writes_what_line_writes_on_every_call() -> None:
    encoder = LineEncoder()
    points = [
        Point("gpu", {"node": f"n {i % 3}", "gpu": str(i % 2)}, {"v": float(i), "n": i, "s": f"x{i}"}, T + i)
        for i in range(20)
    ]
    for p in points * 2:  # second round comes from the caches
        assert encoder.line(p) == line(p)


def test_non_finite_values_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        LineEncoder().line(Point("gpu", {"node": "n"}, {"v": float("nan")}, T))


def test_influxql_strings_are_quoted() -> None:
    assert influxql_string("it's a \\ test") == "'it\\'s a \\\\ test'"
