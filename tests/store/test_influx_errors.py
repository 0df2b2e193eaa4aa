"""How the InfluxDB store tells store errors apart. InfluxDB cannot be made to answer 401,
429 or 503 on demand here, so these run against a real HTTP server on loopback that answers
as InfluxDB does (status, JSON error body, Retry-After) — the closest faithful stand-in; the
partial-write case is also covered against the real influxd (test_store_contract and the
README's check)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.aggregator.store import Point
from gpufleet.aggregator.store.base import PointsRefused, StoreUnavailable
from gpufleet.aggregator.store.influx import InfluxError, InfluxStore

POINT = Point("gpu", {"node": "n1", "gpu": "0"}, {"util_gpu_pct": 1.0}, 1_790_000_040_000_000_000)


@pytest.fixture
def fake_influx() -> Iterator[tuple[str, dict[str, object]]]:
    answer: dict[str, object] = {"status": 204, "body": b"", "headers": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(int(answer["status"]))  # type: ignore[call-overload]
            for k, v in dict(answer["headers"]).items():  # type: ignore[call-overload]
                self.send_header(k, v)
            body = answer["body"]
            self.send_header("Content-Length", str(len(body)))  # type: ignore[arg-type]
            self.end_headers()
            self.wfile.write(body)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", answer
    httpd.shutdown()


def store(url: str) -> InfluxStore:
    return InfluxStore(url, "db", create_database=False)


def test_overload_is_retryable_and_carries_retry_after(fake_influx: tuple[str, dict[str, object]]) -> None:
    url, answer = fake_influx
    for status in (429, 503):
        answer.update(status=status, body=b'{"error":"too many requests"}', headers={"Retry-After": "7"})
        with pytest.raises(InfluxError) as info:
            store(url).write([POINT])
        assert (
            info.value.retryable and info.value.retry_after_s == 7.0 and f"HTTP {status}" in str(info.value)
        )


def test_wrong_credentials_say_so_and_are_not_retried_blindly(
    fake_influx: tuple[str, dict[str, object]],
) -> None:
    url, answer = fake_influx
    answer.update(status=401, body=b'{"error":"authorization failed"}', headers={})
    with pytest.raises(InfluxError) as info:
        store(url).write([POINT])
    assert not info.value.retryable and isinstance(info.value, StoreUnavailable)
    assert "refused the credentials" in str(info.value) and "influx_token" in str(info.value)


def test_partial_write_is_refused_so_the_writer_can_find_the_report(
    fake_influx: tuple[str, dict[str, object]],
) -> None:
    url, answer = fake_influx
    answer.update(
        status=400,
        headers={},
        body=(
            b'{"error":"partial write: field type conflict: input field \\"util_gpu_pct\\" on measurement '
            b'\\"gpu\\" is type string, already exists as type float dropped=2"}'
        ),
    )
    s = store(url)
    # Refused (not "done but for the conflicts"): the writer bisects the batch, refuses the
    # report holding the conflicting points and acknowledges only the rest.
    with pytest.raises(PointsRefused) as info:
        s.write([POINT, POINT, POINT])
    assert "field type conflict" in str(info.value)
    assert s.points_dropped_total == 2


def test_an_unreachable_server_is_retryable() -> None:
    from harness.processes import free_port

    with pytest.raises(InfluxError) as info:
        store(f"http://127.0.0.1:{free_port()}").write([POINT])
    assert info.value.retryable and "cannot reach InfluxDB" in str(info.value)
