from gpufleet.protos import telemetry_pb2 as _telemetry_pb2
from gpufleet.protos import vocabulary_pb2 as _vocabulary_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CollectorMessage(_message.Message):
    __slots__ = ("hello", "report", "command_result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: _telemetry_pb2.NodeReport
    command_result: CommandResult
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[_telemetry_pb2.NodeReport, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "node", "cluster", "boot_id", "collector_version", "interval_s", "gpus", "driver_version", "simulated", "columnar_gpus")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_GPUS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    node: str
    cluster: str
    boot_id: str
    collector_version: str
    interval_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.GpuIdentity]
    driver_version: str
    simulated: bool
    columnar_gpus: bool
    def __init__(self, protocol_version: _Optional[int] = ..., node: _Optional[str] = ..., cluster: _Optional[str] = ..., boot_id: _Optional[str] = ..., collector_version: _Optional[str] = ..., interval_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[_telemetry_pb2.GpuIdentity, _Mapping]]] = ..., driver_version: _Optional[str] = ..., simulated: _Optional[bool] = ..., columnar_gpus: _Optional[bool] = ...) -> None: ...

class AggregatorMessage(_message.Message):
    __slots__ = ("welcome", "ack", "reject", "command")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: Ack
    reject: Reject
    command: Command
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("protocol_version", "aggregator_version", "max_report_bytes", "columnar_gpus")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGGREGATOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_GPUS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    aggregator_version: str
    max_report_bytes: int
    columnar_gpus: bool
    def __init__(self, protocol_version: _Optional[int] = ..., aggregator_version: _Optional[str] = ..., max_report_bytes: _Optional[int] = ..., columnar_gpus: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seqs",)
    SEQS_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("seq", "code", "message")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    code: int
    message: str
    def __init__(self, seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "reason", "reset_gpu")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESET_GPU_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    reset_gpu: ResetGpu
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., reset_gpu: _Optional[_Union[ResetGpu, _Mapping]] = ...) -> None: ...

class ResetGpu(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("id", "outcome", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: _vocabulary_pb2.CommandOutcome
    detail: str
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[_Union[_vocabulary_pb2.CommandOutcome, str]] = ..., detail: _Optional[str] = ...) -> None: ...
