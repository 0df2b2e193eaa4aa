from gpufleet.protos import ingest_pb2 as _ingest_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToWorker(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[WorkerRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[WorkerRequest, _Mapping]]] = ...) -> None: ...

class WorkerRequest(_message.Message):
    __slots__ = ("opened", "report", "closed")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    opened: StreamOpened
    report: ReportToStore
    closed: StreamClosed
    def __init__(self, opened: _Optional[_Union[StreamOpened, _Mapping]] = ..., report: _Optional[_Union[ReportToStore, _Mapping]] = ..., closed: _Optional[_Union[StreamClosed, _Mapping]] = ...) -> None: ...

class StreamOpened(_message.Message):
    __slots__ = ("stream", "hello")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    stream: int
    hello: _ingest_pb2.Hello
    def __init__(self, stream: _Optional[int] = ..., hello: _Optional[_Union[_ingest_pb2.Hello, _Mapping]] = ...) -> None: ...

class StreamClosed(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: int
    def __init__(self, stream: _Optional[int] = ...) -> None: ...

class ReportToStore(_message.Message):
    __slots__ = ("token", "stream", "report")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    token: int
    stream: int
    report: bytes
    def __init__(self, token: _Optional[int] = ..., stream: _Optional[int] = ..., report: _Optional[bytes] = ...) -> None: ...

class FromWorker(_message.Message):
    __slots__ = ("outcomes", "stats")
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[ReportOutcome]
    stats: WorkerStats
    def __init__(self, outcomes: _Optional[_Iterable[_Union[ReportOutcome, _Mapping]]] = ..., stats: _Optional[_Union[WorkerStats, _Mapping]] = ...) -> None: ...

class ReportOutcome(_message.Message):
    __slots__ = ("token", "kind", "code", "reason", "message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ReportOutcome.Kind]
        DURABLE: _ClassVar[ReportOutcome.Kind]
        REJECTED: _ClassVar[ReportOutcome.Kind]
        UNAVAILABLE: _ClassVar[ReportOutcome.Kind]
    KIND_UNSPECIFIED: ReportOutcome.Kind
    DURABLE: ReportOutcome.Kind
    REJECTED: ReportOutcome.Kind
    UNAVAILABLE: ReportOutcome.Kind
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    token: int
    kind: ReportOutcome.Kind
    code: int
    reason: str
    message: str
    def __init__(self, token: _Optional[int] = ..., kind: _Optional[_Union[ReportOutcome.Kind, str]] = ..., code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("pid", "not_acking", "store_error", "oldest_waiting_s", "refused_reports_total", "points_written_total", "store_write_errors_total", "store_writes_total", "store_write_seconds_total", "writer_errors_total", "spool_batches", "spool_bytes", "spool_points", "points_dropped_total", "spool_oldest_age_s", "spool_drained_points_total", "spool_drain_points_per_s", "spool_near_limit", "spool_refused_batches_total", "spool_quarantined_batches", "spool_quarantined_points")
    PID_FIELD_NUMBER: _ClassVar[int]
    NOT_ACKING_FIELD_NUMBER: _ClassVar[int]
    STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAITING_S_FIELD_NUMBER: _ClassVar[int]
    REFUSED_REPORTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POINTS_WRITTEN_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITE_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WRITER_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BATCHES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_POINTS_FIELD_NUMBER: _ClassVar[int]
    POINTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPOOL_OLDEST_AGE_S_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DRAINED_POINTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DRAIN_POINTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SPOOL_NEAR_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SPOOL_REFUSED_BATCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPOOL_QUARANTINED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_QUARANTINED_POINTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    not_acking: str
    store_error: str
    oldest_waiting_s: float
    refused_reports_total: int
    points_written_total: int
    store_write_errors_total: int
    store_writes_total: int
    store_write_seconds_total: float
    writer_errors_total: int
    spool_batches: int
    spool_bytes: int
    spool_points: int
    points_dropped_total: int
    spool_oldest_age_s: float
    spool_drained_points_total: int
    spool_drain_points_per_s: float
    spool_near_limit: bool
    spool_refused_batches_total: int
    spool_quarantined_batches: int
    spool_quarantined_points: int
    def __init__(self, pid: _Optional[int] = ..., not_acking: _Optional[str] = ..., store_error: _Optional[str] = ..., oldest_waiting_s: _Optional[float] = ..., refused_reports_total: _Optional[int] = ..., points_written_total: _Optional[int] = ..., store_write_errors_total: _Optional[int] = ..., store_writes_total: _Optional[int] = ..., store_write_seconds_total: _Optional[float] = ..., writer_errors_total: _Optional[int] = ..., spool_batches: _Optional[int] = ..., spool_bytes: _Optional[int] = ..., spool_points: _Optional[int] = ..., points_dropped_total: _Optional[int] = ..., spool_oldest_age_s: _Optional[float] = ..., spool_drained_points_total: _Optional[int] = ..., spool_drain_points_per_s: _Optional[float] = ..., spool_near_limit: _Optional[bool] = ..., spool_refused_batches_total: _Optional[int] = ..., spool_quarantined_batches: _Optional[int] = ..., spool_quarantined_points: _Optional[int] = ...) -> None: ...
