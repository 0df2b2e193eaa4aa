from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class Liveness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIVENESS_UNSPECIFIED: _ClassVar[Liveness]
    LIVENESS_REPORTING: _ClassVar[Liveness]
    LIVENESS_STALE: _ClassVar[Liveness]
    LIVENESS_SILENT: _ClassVar[Liveness]

class EventSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_SOURCE_UNSPECIFIED: _ClassVar[EventSource]
    EVENT_SOURCE_NVML: _ClassVar[EventSource]
    EVENT_SOURCE_KMSG: _ClassVar[EventSource]
    EVENT_SOURCE_COLLECTOR: _ClassVar[EventSource]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_XID: _ClassVar[EventKind]
    EVENT_KIND_GPU_LOST: _ClassVar[EventKind]
    EVENT_KIND_GPU_RECOVERED: _ClassVar[EventKind]
    EVENT_KIND_ENGINE_UNREADABLE: _ClassVar[EventKind]

class CommandOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_OUTCOME_UNSPECIFIED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_SUCCEEDED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_FAILED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_REFUSED: _ClassVar[CommandOutcome]
LIVENESS_UNSPECIFIED: Liveness
LIVENESS_REPORTING: Liveness
LIVENESS_STALE: Liveness
LIVENESS_SILENT: Liveness
EVENT_SOURCE_UNSPECIFIED: EventSource
EVENT_SOURCE_NVML: EventSource
EVENT_SOURCE_KMSG: EventSource
EVENT_SOURCE_COLLECTOR: EventSource
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_XID: EventKind
EVENT_KIND_GPU_LOST: EventKind
EVENT_KIND_GPU_RECOVERED: EventKind
EVENT_KIND_ENGINE_UNREADABLE: EventKind
COMMAND_OUTCOME_UNSPECIFIED: CommandOutcome
COMMAND_OUTCOME_SUCCEEDED: CommandOutcome
COMMAND_OUTCOME_FAILED: CommandOutcome
COMMAND_OUTCOME_REFUSED: CommandOutcome
