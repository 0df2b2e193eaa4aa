"""What a collector's stream remembers of the reports it sent, for noticing an aggregator that
stopped acknowledging (collector/streaming.py): only what is still unacknowledged, however long
the stream lives — with one aggregator address too, where nothing else would trim it."""

from __future__ import annotations

from gpufleet.collector.replay_buffer import ReplayBuffer
from gpufleet.collector.streaming import _SentReports
from gpufleet.protos import telemetry_pb2


def test_a_long_stream_keeps_only_the_reports_still_waiting() -> None:
    buffer = ReplayBuffer(100)
    sent = _SentReports(buffer)
    for seq in range(1, 10_001):  # a day of reports at a 9 s interval, each acknowledged
        buffer.add(telemetry_pb2.NodeReport(seq=seq))
        sent.add(seq)
        buffer.ack([seq])
    assert len(sent) <= 1 and sent.oldest() is None

    for seq in range(10_001, 10_004):  # the aggregator stops acknowledging
        buffer.add(telemetry_pb2.NodeReport(seq=seq))
        sent.add(seq)
    oldest = sent.oldest()
    assert oldest is not None and oldest[0] == 10_001 and len(sent) == 3

    for seq in range(10_004, 10_500):  # still silent: the full buffer drops the oldest
        buffer.add(telemetry_pb2.NodeReport(seq=seq))
        sent.add(seq)
    oldest = sent.oldest()
    assert len(sent) <= buffer.max_reports and oldest is not None and oldest[0] == 10_400
