from gpufleet.protos import telemetry_pb2 as _telemetry_pb2
from gpufleet.protos import vocabulary_pb2 as _vocabulary_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Aggregate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGGREGATE_UNSPECIFIED: _ClassVar[Aggregate]
    AGGREGATE_MEAN: _ClassVar[Aggregate]
    AGGREGATE_MAX: _ClassVar[Aggregate]
    AGGREGATE_MIN: _ClassVar[Aggregate]
    AGGREGATE_P95: _ClassVar[Aggregate]
    AGGREGATE_LAST: _ClassVar[Aggregate]
    AGGREGATE_COUNT: _ClassVar[Aggregate]
AGGREGATE_UNSPECIFIED: Aggregate
AGGREGATE_MEAN: Aggregate
AGGREGATE_MAX: Aggregate
AGGREGATE_MIN: Aggregate
AGGREGATE_P95: Aggregate
AGGREGATE_LAST: Aggregate
AGGREGATE_COUNT: Aggregate

class WorkloadSummary(_message.Message):
    __slots__ = ("scheduler", "id", "user", "account", "partition", "namespace", "team", "name", "nodes", "gpus", "start_unix_s", "end_unix_s", "gpu_hours_allocated", "gpu_hours_effective", "gpu_hours_idle", "util_mean_pct", "util_max_pct", "sm_mean_pct", "hbm_peak_bytes", "energy_j", "model", "efficiency_pct", "user_hidden", "cost_allocated", "cost_effective")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_IDLE_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_PCT_FIELD_NUMBER: _ClassVar[int]
    UTIL_MAX_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_MEAN_PCT_FIELD_NUMBER: _ClassVar[int]
    HBM_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_PCT_FIELD_NUMBER: _ClassVar[int]
    USER_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    COST_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    COST_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    id: str
    user: str
    account: str
    partition: str
    namespace: str
    team: str
    name: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    gpus: int
    start_unix_s: float
    end_unix_s: float
    gpu_hours_allocated: float
    gpu_hours_effective: float
    gpu_hours_idle: float
    util_mean_pct: float
    util_max_pct: float
    sm_mean_pct: float
    hbm_peak_bytes: int
    energy_j: float
    model: str
    efficiency_pct: float
    user_hidden: bool
    cost_allocated: float
    cost_effective: float
    def __init__(self, scheduler: _Optional[str] = ..., id: _Optional[str] = ..., user: _Optional[str] = ..., account: _Optional[str] = ..., partition: _Optional[str] = ..., namespace: _Optional[str] = ..., team: _Optional[str] = ..., name: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., gpus: _Optional[int] = ..., start_unix_s: _Optional[float] = ..., end_unix_s: _Optional[float] = ..., gpu_hours_allocated: _Optional[float] = ..., gpu_hours_effective: _Optional[float] = ..., gpu_hours_idle: _Optional[float] = ..., util_mean_pct: _Optional[float] = ..., util_max_pct: _Optional[float] = ..., sm_mean_pct: _Optional[float] = ..., hbm_peak_bytes: _Optional[int] = ..., energy_j: _Optional[float] = ..., model: _Optional[str] = ..., efficiency_pct: _Optional[float] = ..., user_hidden: _Optional[bool] = ..., cost_allocated: _Optional[float] = ..., cost_effective: _Optional[float] = ...) -> None: ...

class ListWorkloadsRequest(_message.Message):
    __slots__ = ("ended", "ended_since_unix_ns", "node")
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ENDED_SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    ended_since_unix_ns: int
    node: str
    def __init__(self, ended: _Optional[bool] = ..., ended_since_unix_ns: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class ListWorkloadsResponse(_message.Message):
    __slots__ = ("running", "ended", "scheduler", "scheduler_read_age_s", "placements", "waste")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_READ_AGE_S_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    WASTE_FIELD_NUMBER: _ClassVar[int]
    running: _containers.RepeatedCompositeFieldContainer[WorkloadSummary]
    ended: _containers.RepeatedCompositeFieldContainer[WorkloadSummary]
    scheduler: str
    scheduler_read_age_s: float
    placements: _containers.RepeatedCompositeFieldContainer[WorkloadPlacement]
    waste: _containers.RepeatedCompositeFieldContainer[WasteNow]
    def __init__(self, running: _Optional[_Iterable[_Union[WorkloadSummary, _Mapping]]] = ..., ended: _Optional[_Iterable[_Union[WorkloadSummary, _Mapping]]] = ..., scheduler: _Optional[str] = ..., scheduler_read_age_s: _Optional[float] = ..., placements: _Optional[_Iterable[_Union[WorkloadPlacement, _Mapping]]] = ..., waste: _Optional[_Iterable[_Union[WasteNow, _Mapping]]] = ...) -> None: ...

class WasteNow(_message.Message):
    __slots__ = ("finding", "workload", "nodes", "gpus", "user", "user_hidden", "account", "namespace", "team", "since_unix_ns", "hbm_used_bytes", "evidence")
    FINDING_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    USER_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    HBM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    finding: str
    workload: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    user: str
    user_hidden: bool
    account: str
    namespace: str
    team: str
    since_unix_ns: int
    hbm_used_bytes: int
    evidence: str
    def __init__(self, finding: _Optional[str] = ..., workload: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[int]] = ..., user: _Optional[str] = ..., user_hidden: _Optional[bool] = ..., account: _Optional[str] = ..., namespace: _Optional[str] = ..., team: _Optional[str] = ..., since_unix_ns: _Optional[int] = ..., hbm_used_bytes: _Optional[int] = ..., evidence: _Optional[str] = ...) -> None: ...

class WorkloadPlacement(_message.Message):
    __slots__ = ("node", "gpu", "scheduler", "id")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: int
    scheduler: str
    id: str
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[int] = ..., scheduler: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class GetWorkloadRequest(_message.Message):
    __slots__ = ("scheduler", "id")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    id: str
    def __init__(self, scheduler: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class WorkloadGpu(_message.Message):
    __slots__ = ("node", "gpu", "seconds", "util_mean_pct", "util_max_pct", "idle_seconds", "sm_mean_pct", "hbm_peak_bytes", "energy_j")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_PCT_FIELD_NUMBER: _ClassVar[int]
    UTIL_MAX_PCT_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SM_MEAN_PCT_FIELD_NUMBER: _ClassVar[int]
    HBM_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: int
    seconds: float
    util_mean_pct: float
    util_max_pct: float
    idle_seconds: float
    sm_mean_pct: float
    hbm_peak_bytes: int
    energy_j: float
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[int] = ..., seconds: _Optional[float] = ..., util_mean_pct: _Optional[float] = ..., util_max_pct: _Optional[float] = ..., idle_seconds: _Optional[float] = ..., sm_mean_pct: _Optional[float] = ..., hbm_peak_bytes: _Optional[int] = ..., energy_j: _Optional[float] = ...) -> None: ...

class WorkloadClaim(_message.Message):
    __slots__ = ("node", "gpu_indices", "pids", "process_count", "hbm_used_bytes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    HBM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    process_count: int
    hbm_used_bytes: int
    def __init__(self, node: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., pids: _Optional[_Iterable[int]] = ..., process_count: _Optional[int] = ..., hbm_used_bytes: _Optional[int] = ...) -> None: ...

class WorkloadDetail(_message.Message):
    __slots__ = ("summary", "gpus", "claims")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    summary: WorkloadSummary
    gpus: _containers.RepeatedCompositeFieldContainer[WorkloadGpu]
    claims: _containers.RepeatedCompositeFieldContainer[WorkloadClaim]
    def __init__(self, summary: _Optional[_Union[WorkloadSummary, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[WorkloadGpu, _Mapping]]] = ..., claims: _Optional[_Iterable[_Union[WorkloadClaim, _Mapping]]] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("start_unix_ns", "end_unix_ns", "by")
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    start_unix_ns: int
    end_unix_ns: int
    by: str
    def __init__(self, start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., by: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("owner", "workloads", "gpu_hours_allocated", "gpu_hours_effective", "gpu_hours_idle", "efficiency_pct", "cost_allocated", "cost_effective")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_IDLE_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_PCT_FIELD_NUMBER: _ClassVar[int]
    COST_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    COST_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    workloads: int
    gpu_hours_allocated: float
    gpu_hours_effective: float
    gpu_hours_idle: float
    efficiency_pct: float
    cost_allocated: float
    cost_effective: float
    def __init__(self, owner: _Optional[str] = ..., workloads: _Optional[int] = ..., gpu_hours_allocated: _Optional[float] = ..., gpu_hours_effective: _Optional[float] = ..., gpu_hours_idle: _Optional[float] = ..., efficiency_pct: _Optional[float] = ..., cost_allocated: _Optional[float] = ..., cost_effective: _Optional[float] = ...) -> None: ...

class UsageResponse(_message.Message):
    __slots__ = ("rows", "by", "start_unix_ns", "end_unix_ns")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    by: str
    start_unix_ns: int
    end_unix_ns: int
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., by: _Optional[str] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id", "node", "reason")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    node: str
    reason: str
    def __init__(self, token_id: _Optional[str] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("newly_revoked", "revoked_total")
    NEWLY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    newly_revoked: bool
    revoked_total: int
    def __init__(self, newly_revoked: _Optional[bool] = ..., revoked_total: _Optional[int] = ...) -> None: ...

class ReplayRequest(_message.Message):
    __slots__ = ("start_unix_ns", "end_unix_ns", "policy_toml", "compare", "compare_toml", "policy_name", "compare_name")
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    POLICY_TOML_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    COMPARE_TOML_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    COMPARE_NAME_FIELD_NUMBER: _ClassVar[int]
    start_unix_ns: int
    end_unix_ns: int
    policy_toml: str
    compare: bool
    compare_toml: str
    policy_name: str
    compare_name: str
    def __init__(self, start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., policy_toml: _Optional[str] = ..., compare: _Optional[bool] = ..., compare_toml: _Optional[str] = ..., policy_name: _Optional[str] = ..., compare_name: _Optional[str] = ...) -> None: ...

class ReplayResponse(_message.Message):
    __slots__ = ("report_json", "compare_json", "difference_json")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    COMPARE_JSON_FIELD_NUMBER: _ClassVar[int]
    DIFFERENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    compare_json: str
    difference_json: str
    def __init__(self, report_json: _Optional[str] = ..., compare_json: _Optional[str] = ..., difference_json: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("node", "gpu_index", "code", "severity", "action", "cordon", "reason", "evidence", "first_seen_unix_ns", "window_s", "detected_unix_ns")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    CORDON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    DETECTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu_index: int
    code: str
    severity: _vocabulary_pb2.Severity
    action: _vocabulary_pb2.Action
    cordon: bool
    reason: str
    evidence: str
    first_seen_unix_ns: int
    window_s: float
    detected_unix_ns: int
    def __init__(self, node: _Optional[str] = ..., gpu_index: _Optional[int] = ..., code: _Optional[str] = ..., severity: _Optional[_Union[_vocabulary_pb2.Severity, str]] = ..., action: _Optional[_Union[_vocabulary_pb2.Action, str]] = ..., cordon: _Optional[bool] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., first_seen_unix_ns: _Optional[int] = ..., window_s: _Optional[float] = ..., detected_unix_ns: _Optional[int] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("id", "node", "open", "state", "opened_unix_ns", "closed_unix_ns", "outcome", "findings", "actions", "attempts", "workloads")
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    id: str
    node: str
    open: bool
    state: _vocabulary_pb2.NodeHealth
    opened_unix_ns: int
    closed_unix_ns: int
    outcome: str
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    actions: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    attempts: int
    workloads: _containers.RepeatedCompositeFieldContainer[IncidentWorkload]
    def __init__(self, id: _Optional[str] = ..., node: _Optional[str] = ..., open: _Optional[bool] = ..., state: _Optional[_Union[_vocabulary_pb2.NodeHealth, str]] = ..., opened_unix_ns: _Optional[int] = ..., closed_unix_ns: _Optional[int] = ..., outcome: _Optional[str] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., actions: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., attempts: _Optional[int] = ..., workloads: _Optional[_Iterable[_Union[IncidentWorkload, _Mapping]]] = ...) -> None: ...

class IncidentWorkload(_message.Message):
    __slots__ = ("workload", "name", "user", "user_hidden", "account", "namespace", "team", "gpus", "hit")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    USER_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HIT_FIELD_NUMBER: _ClassVar[int]
    workload: str
    name: str
    user: str
    user_hidden: bool
    account: str
    namespace: str
    team: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    hit: bool
    def __init__(self, workload: _Optional[str] = ..., name: _Optional[str] = ..., user: _Optional[str] = ..., user_hidden: _Optional[bool] = ..., account: _Optional[str] = ..., namespace: _Optional[str] = ..., team: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., hit: _Optional[bool] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("time_unix_ns", "actor", "node", "action", "reason", "outcome", "incident_id", "status")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    actor: str
    node: str
    action: str
    reason: str
    outcome: str
    incident_id: str
    status: _vocabulary_pb2.OutcomeStatus
    def __init__(self, time_unix_ns: _Optional[int] = ..., actor: _Optional[str] = ..., node: _Optional[str] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., outcome: _Optional[str] = ..., incident_id: _Optional[str] = ..., status: _Optional[_Union[_vocabulary_pb2.OutcomeStatus, str]] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("open_only", "node", "limit")
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    open_only: bool
    node: str
    limit: int
    def __init__(self, open_only: _Optional[bool] = ..., node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListIncidentsResponse(_message.Message):
    __slots__ = ("incidents", "server_time_unix_ns")
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    server_time_unix_ns: int
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ..., server_time_unix_ns: _Optional[int] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("node", "limit")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node: str
    limit: int
    def __init__(self, node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries", "server_time_unix_ns")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    server_time_unix_ns: int
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., server_time_unix_ns: _Optional[int] = ...) -> None: ...

class RepairStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeRepairState(_message.Message):
    __slots__ = ("node", "state", "incident_id", "detail", "findings")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    node: str
    state: _vocabulary_pb2.NodeHealth
    incident_id: str
    detail: str
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    def __init__(self, node: _Optional[str] = ..., state: _Optional[_Union[_vocabulary_pb2.NodeHealth, str]] = ..., incident_id: _Optional[str] = ..., detail: _Optional[str] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ...) -> None: ...

class RepairStatus(_message.Message):
    __slots__ = ("enabled", "dry_run", "backend", "breaker_tripped", "breaker_reason", "breaker_tripped_unix_ns", "out_of_service", "out_of_service_cap", "nodes")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BREAKER_TRIPPED_FIELD_NUMBER: _ClassVar[int]
    BREAKER_REASON_FIELD_NUMBER: _ClassVar[int]
    BREAKER_TRIPPED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_SERVICE_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_SERVICE_CAP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    dry_run: bool
    backend: str
    breaker_tripped: bool
    breaker_reason: str
    breaker_tripped_unix_ns: int
    out_of_service: int
    out_of_service_cap: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeRepairState]
    def __init__(self, enabled: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., backend: _Optional[str] = ..., breaker_tripped: _Optional[bool] = ..., breaker_reason: _Optional[str] = ..., breaker_tripped_unix_ns: _Optional[int] = ..., out_of_service: _Optional[int] = ..., out_of_service_cap: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeRepairState, _Mapping]]] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("node", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CordonResponse(_message.Message):
    __slots__ = ("state", "detail")
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    state: _vocabulary_pb2.NodeHealth
    detail: str
    def __init__(self, state: _Optional[_Union[_vocabulary_pb2.NodeHealth, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class ResetBreakerRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ("clusters", "model", "replicas")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    model: str
    replicas: bool
    def __init__(self, clusters: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., replicas: _Optional[bool] = ...) -> None: ...

class PoolReplica(_message.Message):
    __slots__ = ("node", "engine", "port", "gpu_indices", "state", "load_class", "unreadable_reason", "kv_cache_usage_ratio", "requests_running", "requests_waiting", "preemptions_total", "preemptions_per_s", "gpu_util_pct")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_RATIO_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    node: str
    engine: str
    port: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    state: str
    load_class: str
    unreadable_reason: str
    kv_cache_usage_ratio: float
    requests_running: float
    requests_waiting: float
    preemptions_total: float
    preemptions_per_s: float
    gpu_util_pct: float
    def __init__(self, node: _Optional[str] = ..., engine: _Optional[str] = ..., port: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., load_class: _Optional[str] = ..., unreadable_reason: _Optional[str] = ..., kv_cache_usage_ratio: _Optional[float] = ..., requests_running: _Optional[float] = ..., requests_waiting: _Optional[float] = ..., preemptions_total: _Optional[float] = ..., preemptions_per_s: _Optional[float] = ..., gpu_util_pct: _Optional[float] = ...) -> None: ...

class ServingPool(_message.Message):
    __slots__ = ("cluster", "model", "replicas_serving", "replicas_draining", "replicas_out", "kv_cache_usage_mean_ratio", "kv_cache_usage_max_ratio", "requests_running", "requests_waiting", "preemptions_per_s", "kv_cache_usage_if_one_leaves_ratio", "headroom_replicas", "nodes_waiting", "replicas", "replicas_idle")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_SERVING_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_OUT_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_MEAN_RATIO_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_MAX_RATIO_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_IF_ONE_LEAVES_RATIO_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODES_WAITING_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_IDLE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    model: str
    replicas_serving: int
    replicas_draining: int
    replicas_out: int
    kv_cache_usage_mean_ratio: float
    kv_cache_usage_max_ratio: float
    requests_running: float
    requests_waiting: float
    preemptions_per_s: float
    kv_cache_usage_if_one_leaves_ratio: float
    headroom_replicas: int
    nodes_waiting: _containers.RepeatedScalarFieldContainer[str]
    replicas: _containers.RepeatedCompositeFieldContainer[PoolReplica]
    replicas_idle: int
    def __init__(self, cluster: _Optional[str] = ..., model: _Optional[str] = ..., replicas_serving: _Optional[int] = ..., replicas_draining: _Optional[int] = ..., replicas_out: _Optional[int] = ..., kv_cache_usage_mean_ratio: _Optional[float] = ..., kv_cache_usage_max_ratio: _Optional[float] = ..., requests_running: _Optional[float] = ..., requests_waiting: _Optional[float] = ..., preemptions_per_s: _Optional[float] = ..., kv_cache_usage_if_one_leaves_ratio: _Optional[float] = ..., headroom_replicas: _Optional[int] = ..., nodes_waiting: _Optional[_Iterable[str]] = ..., replicas: _Optional[_Iterable[_Union[PoolReplica, _Mapping]]] = ..., replicas_idle: _Optional[int] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools", "floor_kv_cache_usage_ratio", "floor_min_serving_replicas", "guard", "formula", "load_class_rule", "server_time_unix_ns", "truncated", "unverified", "unverified_total", "pools_declared")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    FLOOR_KV_CACHE_USAGE_RATIO_FIELD_NUMBER: _ClassVar[int]
    FLOOR_MIN_SERVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    LOAD_CLASS_RULE_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POOLS_DECLARED_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[ServingPool]
    floor_kv_cache_usage_ratio: float
    floor_min_serving_replicas: int
    guard: bool
    formula: str
    load_class_rule: str
    server_time_unix_ns: int
    truncated: bool
    unverified: _containers.RepeatedCompositeFieldContainer[UnverifiedReplica]
    unverified_total: int
    pools_declared: int
    def __init__(self, pools: _Optional[_Iterable[_Union[ServingPool, _Mapping]]] = ..., floor_kv_cache_usage_ratio: _Optional[float] = ..., floor_min_serving_replicas: _Optional[int] = ..., guard: _Optional[bool] = ..., formula: _Optional[str] = ..., load_class_rule: _Optional[str] = ..., server_time_unix_ns: _Optional[int] = ..., truncated: _Optional[bool] = ..., unverified: _Optional[_Iterable[_Union[UnverifiedReplica, _Mapping]]] = ..., unverified_total: _Optional[int] = ..., pools_declared: _Optional[int] = ...) -> None: ...

class UnverifiedReplica(_message.Message):
    __slots__ = ("node", "engine", "port", "claimed", "reason", "kind", "cluster", "model", "replica")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    node: str
    engine: str
    port: int
    claimed: str
    reason: str
    kind: str
    cluster: str
    model: str
    replica: PoolReplica
    def __init__(self, node: _Optional[str] = ..., engine: _Optional[str] = ..., port: _Optional[int] = ..., claimed: _Optional[str] = ..., reason: _Optional[str] = ..., kind: _Optional[str] = ..., cluster: _Optional[str] = ..., model: _Optional[str] = ..., replica: _Optional[_Union[PoolReplica, _Mapping]] = ...) -> None: ...

class DrainProjection(_message.Message):
    __slots__ = ("cluster", "model", "replicas_now", "replicas_after", "kv_cache_usage_now_ratio", "kv_cache_usage_after_ratio", "below_floor")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_NOW_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_AFTER_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_NOW_RATIO_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_AFTER_RATIO_FIELD_NUMBER: _ClassVar[int]
    BELOW_FLOOR_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    model: str
    replicas_now: int
    replicas_after: int
    kv_cache_usage_now_ratio: float
    kv_cache_usage_after_ratio: float
    below_floor: bool
    def __init__(self, cluster: _Optional[str] = ..., model: _Optional[str] = ..., replicas_now: _Optional[int] = ..., replicas_after: _Optional[int] = ..., kv_cache_usage_now_ratio: _Optional[float] = ..., kv_cache_usage_after_ratio: _Optional[float] = ..., below_floor: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpoolStatus(_message.Message):
    __slots__ = ("bytes", "batches", "points", "oldest_age_s", "drain_points_per_s", "drained_points_total", "max_bytes", "near_limit", "refused_batches_total", "quarantined_batches", "quarantined_points", "quarantine_dir")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DRAIN_POINTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DRAINED_POINTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    NEAR_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BATCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_POINTS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINE_DIR_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    batches: int
    points: int
    oldest_age_s: float
    drain_points_per_s: float
    drained_points_total: int
    max_bytes: int
    near_limit: bool
    refused_batches_total: int
    quarantined_batches: int
    quarantined_points: int
    quarantine_dir: str
    def __init__(self, bytes: _Optional[int] = ..., batches: _Optional[int] = ..., points: _Optional[int] = ..., oldest_age_s: _Optional[float] = ..., drain_points_per_s: _Optional[float] = ..., drained_points_total: _Optional[int] = ..., max_bytes: _Optional[int] = ..., near_limit: _Optional[bool] = ..., refused_batches_total: _Optional[int] = ..., quarantined_batches: _Optional[int] = ..., quarantined_points: _Optional[int] = ..., quarantine_dir: _Optional[str] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("name", "restarts_total", "last_error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    restarts_total: int
    last_error: str
    def __init__(self, name: _Optional[str] = ..., restarts_total: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class AggregatorStatus(_message.Message):
    __slots__ = ("version", "store", "store_ok", "store_error", "spool", "store_points_dropped_total", "nodes", "streams_open", "healthy", "unhealthy_reasons", "acknowledging", "not_acknowledging_reason", "oldest_unacked_s", "tasks", "store_refused_reports_total", "listener_errors_total", "listener_reports_dropped_total", "control_plane", "replica_id", "repair_leader", "leader", "leader_epoch", "leader_lease_left_s", "replicas")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    STORE_OK_FIELD_NUMBER: _ClassVar[int]
    STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    SPOOL_FIELD_NUMBER: _ClassVar[int]
    STORE_POINTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_OPEN_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_REASONS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGING_FIELD_NUMBER: _ClassVar[int]
    NOT_ACKNOWLEDGING_REASON_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_S_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    STORE_REFUSED_REPORTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LISTENER_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LISTENER_REPORTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPAIR_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_LEASE_LEFT_S_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    version: str
    store: str
    store_ok: bool
    store_error: str
    spool: SpoolStatus
    store_points_dropped_total: int
    nodes: int
    streams_open: int
    healthy: bool
    unhealthy_reasons: _containers.RepeatedScalarFieldContainer[str]
    acknowledging: bool
    not_acknowledging_reason: str
    oldest_unacked_s: float
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatus]
    store_refused_reports_total: int
    listener_errors_total: int
    listener_reports_dropped_total: int
    control_plane: str
    replica_id: str
    repair_leader: bool
    leader: str
    leader_epoch: int
    leader_lease_left_s: float
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, version: _Optional[str] = ..., store: _Optional[str] = ..., store_ok: _Optional[bool] = ..., store_error: _Optional[str] = ..., spool: _Optional[_Union[SpoolStatus, _Mapping]] = ..., store_points_dropped_total: _Optional[int] = ..., nodes: _Optional[int] = ..., streams_open: _Optional[int] = ..., healthy: _Optional[bool] = ..., unhealthy_reasons: _Optional[_Iterable[str]] = ..., acknowledging: _Optional[bool] = ..., not_acknowledging_reason: _Optional[str] = ..., oldest_unacked_s: _Optional[float] = ..., tasks: _Optional[_Iterable[_Union[TaskStatus, _Mapping]]] = ..., store_refused_reports_total: _Optional[int] = ..., listener_errors_total: _Optional[int] = ..., listener_reports_dropped_total: _Optional[int] = ..., control_plane: _Optional[str] = ..., replica_id: _Optional[str] = ..., repair_leader: _Optional[bool] = ..., leader: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_lease_left_s: _Optional[float] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "fleet_address", "ingest_address", "streams_open", "heartbeat_age_s", "leader")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INGEST_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_OPEN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    fleet_address: str
    ingest_address: str
    streams_open: int
    heartbeat_age_s: float
    leader: bool
    def __init__(self, replica_id: _Optional[str] = ..., fleet_address: _Optional[str] = ..., ingest_address: _Optional[str] = ..., streams_open: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ..., leader: _Optional[bool] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("name", "role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("clusters", "liveness", "page_size", "page_token")
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    liveness: _containers.RepeatedScalarFieldContainer[_vocabulary_pb2.Liveness]
    page_size: int
    page_token: str
    def __init__(self, clusters: _Optional[_Iterable[str]] = ..., liveness: _Optional[_Iterable[_Union[_vocabulary_pb2.Liveness, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class NodeSummary(_message.Message):
    __slots__ = ("node", "cluster", "liveness", "last_report_unix_ns", "seconds_since_report", "boot_id", "last_seq", "interval_s", "simulated", "driver_version", "gpu_count", "gpus", "connected", "health", "health_detail", "engines", "last_sample_unix_ns", "replica", "lemon", "recent_incidents", "scheduler_node", "gpus_on_pci_bus", "clipped_bytes", "gpu_states")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_REPORT_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEMON_FIELD_NUMBER: _ClassVar[int]
    RECENT_INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_ON_PCI_BUS_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_STATES_FIELD_NUMBER: _ClassVar[int]
    node: str
    cluster: str
    liveness: _vocabulary_pb2.Liveness
    last_report_unix_ns: int
    seconds_since_report: float
    boot_id: str
    last_seq: int
    interval_s: float
    simulated: bool
    driver_version: str
    gpu_count: int
    gpus: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.GpuSample]
    connected: bool
    health: _vocabulary_pb2.NodeHealth
    health_detail: str
    engines: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.EngineSample]
    last_sample_unix_ns: int
    replica: str
    lemon: bool
    recent_incidents: int
    scheduler_node: str
    gpus_on_pci_bus: int
    clipped_bytes: int
    gpu_states: _containers.RepeatedCompositeFieldContainer[GpuState]
    def __init__(self, node: _Optional[str] = ..., cluster: _Optional[str] = ..., liveness: _Optional[_Union[_vocabulary_pb2.Liveness, str]] = ..., last_report_unix_ns: _Optional[int] = ..., seconds_since_report: _Optional[float] = ..., boot_id: _Optional[str] = ..., last_seq: _Optional[int] = ..., interval_s: _Optional[float] = ..., simulated: _Optional[bool] = ..., driver_version: _Optional[str] = ..., gpu_count: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[_telemetry_pb2.GpuSample, _Mapping]]] = ..., connected: _Optional[bool] = ..., health: _Optional[_Union[_vocabulary_pb2.NodeHealth, str]] = ..., health_detail: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[_telemetry_pb2.EngineSample, _Mapping]]] = ..., last_sample_unix_ns: _Optional[int] = ..., replica: _Optional[str] = ..., lemon: _Optional[bool] = ..., recent_incidents: _Optional[int] = ..., scheduler_node: _Optional[str] = ..., gpus_on_pci_bus: _Optional[int] = ..., clipped_bytes: _Optional[int] = ..., gpu_states: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("index", "health", "findings", "detail")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    index: int
    health: _vocabulary_pb2.GpuHealth
    findings: _containers.RepeatedScalarFieldContainer[str]
    detail: str
    def __init__(self, index: _Optional[int] = ..., health: _Optional[_Union[_vocabulary_pb2.GpuHealth, str]] = ..., findings: _Optional[_Iterable[str]] = ..., detail: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "server_time_unix_ns", "next_page_token", "total_nodes")
    NODES_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeSummary]
    server_time_unix_ns: int
    next_page_token: str
    total_nodes: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeSummary, _Mapping]]] = ..., server_time_unix_ns: _Optional[int] = ..., next_page_token: _Optional[str] = ..., total_nodes: _Optional[int] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class NodeDetail(_message.Message):
    __slots__ = ("summary", "engines", "recent_events", "collector_stats", "if_drained", "clipped_bytes")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    RECENT_EVENTS_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_STATS_FIELD_NUMBER: _ClassVar[int]
    IF_DRAINED_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    summary: NodeSummary
    engines: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.EngineSample]
    recent_events: _containers.RepeatedCompositeFieldContainer[_telemetry_pb2.Event]
    collector_stats: _telemetry_pb2.CollectorStats
    if_drained: _containers.RepeatedCompositeFieldContainer[DrainProjection]
    clipped_bytes: int
    def __init__(self, summary: _Optional[_Union[NodeSummary, _Mapping]] = ..., engines: _Optional[_Iterable[_Union[_telemetry_pb2.EngineSample, _Mapping]]] = ..., recent_events: _Optional[_Iterable[_Union[_telemetry_pb2.Event, _Mapping]]] = ..., collector_stats: _Optional[_Union[_telemetry_pb2.CollectorStats, _Mapping]] = ..., if_drained: _Optional[_Iterable[_Union[DrainProjection, _Mapping]]] = ..., clipped_bytes: _Optional[int] = ...) -> None: ...

class ListMetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricInfo(_message.Message):
    __slots__ = ("name", "measurement", "unit", "help", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    measurement: str
    unit: str
    help: str
    source: str
    def __init__(self, name: _Optional[str] = ..., measurement: _Optional[str] = ..., unit: _Optional[str] = ..., help: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ListMetricsResponse(_message.Message):
    __slots__ = ("metrics",)
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    def __init__(self, metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("metric", "nodes", "gpus", "clusters", "engines", "models", "start_unix_ns", "end_unix_ns", "step_ns", "aggregate", "group_by")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_NS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    metric: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    engines: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    start_unix_ns: int
    end_unix_ns: int
    step_ns: int
    aggregate: Aggregate
    group_by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metric: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[int]] = ..., clusters: _Optional[_Iterable[str]] = ..., engines: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., step_ns: _Optional[int] = ..., aggregate: _Optional[_Union[Aggregate, str]] = ..., group_by: _Optional[_Iterable[str]] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("tags", "times_unix_ns", "values")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TIMES_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.ScalarMap[str, str]
    times_unix_ns: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, tags: _Optional[_Mapping[str, str]] = ..., times_unix_ns: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("metric", "measurement", "unit", "aggregate", "step_ns", "start_unix_ns", "end_unix_ns", "series", "help")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    STEP_NS_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    metric: str
    measurement: str
    unit: str
    aggregate: Aggregate
    step_ns: int
    start_unix_ns: int
    end_unix_ns: int
    series: _containers.RepeatedCompositeFieldContainer[Series]
    help: str
    def __init__(self, metric: _Optional[str] = ..., measurement: _Optional[str] = ..., unit: _Optional[str] = ..., aggregate: _Optional[_Union[Aggregate, str]] = ..., step_ns: _Optional[int] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ..., help: _Optional[str] = ...) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = ("start_unix_ns", "end_unix_ns", "nodes", "gpus", "xids", "kinds", "clusters", "limit")
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    XIDS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start_unix_ns: int
    end_unix_ns: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    xids: _containers.RepeatedScalarFieldContainer[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[int]] = ..., xids: _Optional[_Iterable[int]] = ..., kinds: _Optional[_Iterable[str]] = ..., clusters: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class HistoryEvent(_message.Message):
    __slots__ = ("time_unix_ns", "node", "cluster", "gpu_index", "kind", "source", "xid", "count", "first_time_unix_ns", "summary", "code", "severity", "outcome", "incident_id")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    node: str
    cluster: str
    gpu_index: int
    kind: str
    source: str
    xid: int
    count: int
    first_time_unix_ns: int
    summary: str
    code: str
    severity: str
    outcome: str
    incident_id: str
    def __init__(self, time_unix_ns: _Optional[int] = ..., node: _Optional[str] = ..., cluster: _Optional[str] = ..., gpu_index: _Optional[int] = ..., kind: _Optional[str] = ..., source: _Optional[str] = ..., xid: _Optional[int] = ..., count: _Optional[int] = ..., first_time_unix_ns: _Optional[int] = ..., summary: _Optional[str] = ..., code: _Optional[str] = ..., severity: _Optional[str] = ..., outcome: _Optional[str] = ..., incident_id: _Optional[str] = ...) -> None: ...

class EventsResponse(_message.Message):
    __slots__ = ("events", "truncated", "start_unix_ns", "end_unix_ns")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[HistoryEvent]
    truncated: bool
    start_unix_ns: int
    end_unix_ns: int
    def __init__(self, events: _Optional[_Iterable[_Union[HistoryEvent, _Mapping]]] = ..., truncated: _Optional[bool] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ...) -> None: ...
