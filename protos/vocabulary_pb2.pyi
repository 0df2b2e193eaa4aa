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

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_CRITICAL: _ClassVar[Severity]

class NodeHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_HEALTH_UNSPECIFIED: _ClassVar[NodeHealth]
    NODE_HEALTH_HEALTHY: _ClassVar[NodeHealth]
    NODE_HEALTH_SUSPECT: _ClassVar[NodeHealth]
    NODE_HEALTH_CORDONED: _ClassVar[NodeHealth]
    NODE_HEALTH_DRAINING: _ClassVar[NodeHealth]
    NODE_HEALTH_REPAIRING: _ClassVar[NodeHealth]
    NODE_HEALTH_VALIDATING: _ClassVar[NodeHealth]
    NODE_HEALTH_QUARANTINED: _ClassVar[NodeHealth]
    NODE_HEALTH_HUMAN_CORDONED: _ClassVar[NodeHealth]
    NODE_HEALTH_WAITING: _ClassVar[NodeHealth]
    NODE_HEALTH_NO_DATA: _ClassVar[NodeHealth]

class GpuHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_UNSPECIFIED: _ClassVar[GpuHealth]
    GPU_HEALTH_OK: _ClassVar[GpuHealth]
    GPU_HEALTH_WATCH: _ClassVar[GpuHealth]
    GPU_HEALTH_SUSPECT: _ClassVar[GpuHealth]
    GPU_HEALTH_FAULTY: _ClassVar[GpuHealth]
    GPU_HEALTH_LOST: _ClassVar[GpuHealth]

class OutcomeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_STATUS_UNSPECIFIED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_OK: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_FAILED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_REFUSED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_SKIPPED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_DRY_RUN: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_STARTED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_UNKNOWN: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_OBSERVED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_HELD: _ClassVar[OutcomeStatus]

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_UNSPECIFIED: _ClassVar[Action]
    ACTION_IGNORE: _ClassVar[Action]
    ACTION_RESTART_APP: _ClassVar[Action]
    ACTION_RESET_GPU: _ClassVar[Action]
    ACTION_RESTART_BM: _ClassVar[Action]
    ACTION_RESTART_VM: _ClassVar[Action]
    ACTION_CONTACT_SUPPORT: _ClassVar[Action]
    ACTION_CHECK_MECHANICALS: _ClassVar[Action]
    ACTION_UPDATE_SWFW: _ClassVar[Action]
    ACTION_CHECK_UVM: _ClassVar[Action]
    ACTION_WORKFLOW_XID_45: _ClassVar[Action]
    ACTION_WORKFLOW_XID_48: _ClassVar[Action]
    ACTION_DRAIN_AND_RESET: _ClassVar[Action]
    ACTION_WORKFLOW_NVLINK_ERR: _ClassVar[Action]
    ACTION_WORKFLOW_NVLINK5_ERR: _ClassVar[Action]
    ACTION_XID_154_EVAL: _ClassVar[Action]
    ACTION_ALERT_ONLY: _ClassVar[Action]
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
SEVERITY_UNSPECIFIED: Severity
SEVERITY_INFO: Severity
SEVERITY_WARNING: Severity
SEVERITY_CRITICAL: Severity
NODE_HEALTH_UNSPECIFIED: NodeHealth
NODE_HEALTH_HEALTHY: NodeHealth
NODE_HEALTH_SUSPECT: NodeHealth
NODE_HEALTH_CORDONED: NodeHealth
NODE_HEALTH_DRAINING: NodeHealth
NODE_HEALTH_REPAIRING: NodeHealth
NODE_HEALTH_VALIDATING: NodeHealth
NODE_HEALTH_QUARANTINED: NodeHealth
NODE_HEALTH_HUMAN_CORDONED: NodeHealth
NODE_HEALTH_WAITING: NodeHealth
NODE_HEALTH_NO_DATA: NodeHealth
GPU_HEALTH_UNSPECIFIED: GpuHealth
GPU_HEALTH_OK: GpuHealth
GPU_HEALTH_WATCH: GpuHealth
GPU_HEALTH_SUSPECT: GpuHealth
GPU_HEALTH_FAULTY: GpuHealth
GPU_HEALTH_LOST: GpuHealth
OUTCOME_STATUS_UNSPECIFIED: OutcomeStatus
OUTCOME_STATUS_OK: OutcomeStatus
OUTCOME_STATUS_FAILED: OutcomeStatus
OUTCOME_STATUS_REFUSED: OutcomeStatus
OUTCOME_STATUS_SKIPPED: OutcomeStatus
OUTCOME_STATUS_DRY_RUN: OutcomeStatus
OUTCOME_STATUS_STARTED: OutcomeStatus
OUTCOME_STATUS_UNKNOWN: OutcomeStatus
OUTCOME_STATUS_OBSERVED: OutcomeStatus
OUTCOME_STATUS_HELD: OutcomeStatus
ACTION_UNSPECIFIED: Action
ACTION_IGNORE: Action
ACTION_RESTART_APP: Action
ACTION_RESET_GPU: Action
ACTION_RESTART_BM: Action
ACTION_RESTART_VM: Action
ACTION_CONTACT_SUPPORT: Action
ACTION_CHECK_MECHANICALS: Action
ACTION_UPDATE_SWFW: Action
ACTION_CHECK_UVM: Action
ACTION_WORKFLOW_XID_45: Action
ACTION_WORKFLOW_XID_48: Action
ACTION_DRAIN_AND_RESET: Action
ACTION_WORKFLOW_NVLINK_ERR: Action
ACTION_WORKFLOW_NVLINK5_ERR: Action
ACTION_XID_154_EVAL: Action
ACTION_ALERT_ONLY: Action
