from gpufleet.protos import vocabulary_pb2 as _vocabulary_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuSample(_message.Message):
    __slots__ = ("index", "uuid", "model", "pci_bus_id", "lost", "util_gpu_pct", "util_mem_pct", "hbm_used_bytes", "hbm_total_bytes", "temp_gpu_c", "temp_mem_c", "power_w", "power_limit_w", "clock_sm_mhz", "clock_mem_mhz", "clock_event_reasons", "throttle_thermal", "throttle_power", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure", "pcie_replay_total", "nvlink_links_active", "nvlink_links_inactive", "nvlink_replay_total", "nvlink_recovery_total", "nvlink_crc_total", "process_count", "driver_unresponsive", "driver_unresponsive_call", "driver_unresponsive_s", "recovery_action", "pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max", "fabric_state", "fabric_status", "ecc_sbe_rate_per_s", "clock_sm_target_mhz", "sm_active_pct", "tensor_active_pct", "processes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    UTIL_GPU_PCT_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEM_PCT_FIELD_NUMBER: _ClassVar[int]
    HBM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HBM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMP_GPU_C_FIELD_NUMBER: _ClassVar[int]
    TEMP_MEM_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SM_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MEM_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_THERMAL_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_POWER_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAP_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_LINKS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_LINKS_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_REPLAY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_RECOVERY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_CRC_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_UNRESPONSIVE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_UNRESPONSIVE_CALL_FIELD_NUMBER: _ClassVar[int]
    DRIVER_UNRESPONSIVE_S_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    FABRIC_STATE_FIELD_NUMBER: _ClassVar[int]
    FABRIC_STATUS_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SM_TARGET_MHZ_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    lost: bool
    util_gpu_pct: float
    util_mem_pct: float
    hbm_used_bytes: int
    hbm_total_bytes: int
    temp_gpu_c: float
    temp_mem_c: float
    power_w: float
    power_limit_w: float
    clock_sm_mhz: float
    clock_mem_mhz: float
    clock_event_reasons: int
    throttle_thermal: bool
    throttle_power: bool
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    remap_correctable: int
    remap_uncorrectable: int
    remap_pending: bool
    remap_failure: bool
    pcie_replay_total: int
    nvlink_links_active: int
    nvlink_links_inactive: int
    nvlink_replay_total: int
    nvlink_recovery_total: int
    nvlink_crc_total: int
    process_count: int
    driver_unresponsive: bool
    driver_unresponsive_call: str
    driver_unresponsive_s: float
    recovery_action: int
    pcie_link_gen: int
    pcie_link_gen_max: int
    pcie_link_width: int
    pcie_link_width_max: int
    fabric_state: int
    fabric_status: int
    ecc_sbe_rate_per_s: float
    clock_sm_target_mhz: float
    sm_active_pct: float
    tensor_active_pct: float
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., lost: _Optional[bool] = ..., util_gpu_pct: _Optional[float] = ..., util_mem_pct: _Optional[float] = ..., hbm_used_bytes: _Optional[int] = ..., hbm_total_bytes: _Optional[int] = ..., temp_gpu_c: _Optional[float] = ..., temp_mem_c: _Optional[float] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., clock_sm_mhz: _Optional[float] = ..., clock_mem_mhz: _Optional[float] = ..., clock_event_reasons: _Optional[int] = ..., throttle_thermal: _Optional[bool] = ..., throttle_power: _Optional[bool] = ..., ecc_sbe_volatile: _Optional[int] = ..., ecc_dbe_volatile: _Optional[int] = ..., ecc_sbe_aggregate: _Optional[int] = ..., ecc_dbe_aggregate: _Optional[int] = ..., retired_pages_sbe: _Optional[int] = ..., retired_pages_dbe: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., remap_correctable: _Optional[int] = ..., remap_uncorrectable: _Optional[int] = ..., remap_pending: _Optional[bool] = ..., remap_failure: _Optional[bool] = ..., pcie_replay_total: _Optional[int] = ..., nvlink_links_active: _Optional[int] = ..., nvlink_links_inactive: _Optional[int] = ..., nvlink_replay_total: _Optional[int] = ..., nvlink_recovery_total: _Optional[int] = ..., nvlink_crc_total: _Optional[int] = ..., process_count: _Optional[int] = ..., driver_unresponsive: _Optional[bool] = ..., driver_unresponsive_call: _Optional[str] = ..., driver_unresponsive_s: _Optional[float] = ..., recovery_action: _Optional[int] = ..., pcie_link_gen: _Optional[int] = ..., pcie_link_gen_max: _Optional[int] = ..., pcie_link_width: _Optional[int] = ..., pcie_link_width_max: _Optional[int] = ..., fabric_state: _Optional[int] = ..., fabric_status: _Optional[int] = ..., ecc_sbe_rate_per_s: _Optional[float] = ..., clock_sm_target_mhz: _Optional[float] = ..., sm_active_pct: _Optional[float] = ..., tensor_active_pct: _Optional[float] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory_bytes: int
    def __init__(self, pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ...) -> None: ...

class EngineSample(_message.Message):
    __slots__ = ("engine", "model", "port", "endpoint", "gpu_indices", "readable", "unreadable_reason", "pool", "kv_cache_usage_ratio", "requests_running", "requests_waiting", "preemptions_total", "prefix_cache_hit_ratio")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    READABLE_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_RATIO_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    engine: str
    model: str
    port: int
    endpoint: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    readable: bool
    unreadable_reason: str
    pool: str
    kv_cache_usage_ratio: float
    requests_running: float
    requests_waiting: float
    preemptions_total: float
    prefix_cache_hit_ratio: float
    def __init__(self, engine: _Optional[str] = ..., model: _Optional[str] = ..., port: _Optional[int] = ..., endpoint: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., readable: _Optional[bool] = ..., unreadable_reason: _Optional[str] = ..., pool: _Optional[str] = ..., kv_cache_usage_ratio: _Optional[float] = ..., requests_running: _Optional[float] = ..., requests_waiting: _Optional[float] = ..., preemptions_total: _Optional[float] = ..., prefix_cache_hit_ratio: _Optional[float] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("kind", "source", "time_unix_ns", "gpu_index", "pci_bus_id", "xid", "message", "pid", "process_name", "count", "first_time_unix_ns", "kmsg_seq", "kernel_boot_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    KMSG_SEQ_FIELD_NUMBER: _ClassVar[int]
    KERNEL_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    kind: _vocabulary_pb2.EventKind
    source: _vocabulary_pb2.EventSource
    time_unix_ns: int
    gpu_index: int
    pci_bus_id: str
    xid: int
    message: str
    pid: int
    process_name: str
    count: int
    first_time_unix_ns: int
    kmsg_seq: int
    kernel_boot_id: str
    def __init__(self, kind: _Optional[_Union[_vocabulary_pb2.EventKind, str]] = ..., source: _Optional[_Union[_vocabulary_pb2.EventSource, str]] = ..., time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., pci_bus_id: _Optional[str] = ..., xid: _Optional[int] = ..., message: _Optional[str] = ..., pid: _Optional[int] = ..., process_name: _Optional[str] = ..., count: _Optional[int] = ..., first_time_unix_ns: _Optional[int] = ..., kmsg_seq: _Optional[int] = ..., kernel_boot_id: _Optional[str] = ...) -> None: ...

class CollectorStats(_message.Message):
    __slots__ = ("reports_dropped_total", "reports_rejected_total", "unacked_reports", "reconnects_total", "sample_errors_total", "sample_duration_s", "kmsg_lines_unparsed_total", "xid_unknown_gpu_total", "xid_duplicates_total", "engine_scrapes_failed_total", "xid_folded_total", "kmsg_records_caught_up_total", "nvml_calls_hung_total")
    REPORTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REPORTS_REJECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNACKED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    RECONNECTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    KMSG_LINES_UNPARSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    XID_UNKNOWN_GPU_TOTAL_FIELD_NUMBER: _ClassVar[int]
    XID_DUPLICATES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SCRAPES_FAILED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    XID_FOLDED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KMSG_RECORDS_CAUGHT_UP_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVML_CALLS_HUNG_TOTAL_FIELD_NUMBER: _ClassVar[int]
    reports_dropped_total: int
    reports_rejected_total: int
    unacked_reports: int
    reconnects_total: int
    sample_errors_total: int
    sample_duration_s: float
    kmsg_lines_unparsed_total: int
    xid_unknown_gpu_total: int
    xid_duplicates_total: int
    engine_scrapes_failed_total: int
    xid_folded_total: int
    kmsg_records_caught_up_total: int
    nvml_calls_hung_total: int
    def __init__(self, reports_dropped_total: _Optional[int] = ..., reports_rejected_total: _Optional[int] = ..., unacked_reports: _Optional[int] = ..., reconnects_total: _Optional[int] = ..., sample_errors_total: _Optional[int] = ..., sample_duration_s: _Optional[float] = ..., kmsg_lines_unparsed_total: _Optional[int] = ..., xid_unknown_gpu_total: _Optional[int] = ..., xid_duplicates_total: _Optional[int] = ..., engine_scrapes_failed_total: _Optional[int] = ..., xid_folded_total: _Optional[int] = ..., kmsg_records_caught_up_total: _Optional[int] = ..., nvml_calls_hung_total: _Optional[int] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("node", "cluster", "boot_id", "seq", "time_unix_ns", "interval_s", "gpus", "engines", "events", "stats", "gpus_on_pci_bus", "gpu_columns", "workloads")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    GPUS_ON_PCI_BUS_FIELD_NUMBER: _ClassVar[int]
    GPU_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    node: str
    cluster: str
    boot_id: str
    seq: int
    time_unix_ns: int
    interval_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    engines: _containers.RepeatedCompositeFieldContainer[EngineSample]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    stats: CollectorStats
    gpus_on_pci_bus: int
    gpu_columns: GpuColumns
    workloads: _containers.RepeatedCompositeFieldContainer[WorkloadSample]
    def __init__(self, node: _Optional[str] = ..., cluster: _Optional[str] = ..., boot_id: _Optional[str] = ..., seq: _Optional[int] = ..., time_unix_ns: _Optional[int] = ..., interval_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., engines: _Optional[_Iterable[_Union[EngineSample, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., stats: _Optional[_Union[CollectorStats, _Mapping]] = ..., gpus_on_pci_bus: _Optional[int] = ..., gpu_columns: _Optional[_Union[GpuColumns, _Mapping]] = ..., workloads: _Optional[_Iterable[_Union[WorkloadSample, _Mapping]]] = ...) -> None: ...

class WorkloadSample(_message.Message):
    __slots__ = ("scheduler", "id", "part", "gpu_indices", "pids", "process_count", "hbm_used_bytes", "source")
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    HBM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    scheduler: str
    id: str
    part: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    pids: _containers.RepeatedScalarFieldContainer[int]
    process_count: int
    hbm_used_bytes: int
    source: str
    def __init__(self, scheduler: _Optional[str] = ..., id: _Optional[str] = ..., part: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., pids: _Optional[_Iterable[int]] = ..., process_count: _Optional[int] = ..., hbm_used_bytes: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class GpuColumns(_message.Message):
    __slots__ = ("count", "index", "uuid", "model", "pci_bus_id", "lost", "double_fields", "doubles", "integer_fields", "integers", "bool_fields", "bools", "present", "driver_unresponsive_call", "process_gpu_index", "process_pid", "process_used_memory_bytes", "process_used_memory_present")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_FIELDS_FIELD_NUMBER: _ClassVar[int]
    DOUBLES_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELDS_FIELD_NUMBER: _ClassVar[int]
    INTEGERS_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELDS_FIELD_NUMBER: _ClassVar[int]
    BOOLS_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_UNRESPONSIVE_CALL_FIELD_NUMBER: _ClassVar[int]
    PROCESS_GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROCESS_PID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_USED_MEMORY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    count: int
    index: _containers.RepeatedScalarFieldContainer[int]
    uuid: _containers.RepeatedScalarFieldContainer[str]
    model: _containers.RepeatedScalarFieldContainer[str]
    pci_bus_id: _containers.RepeatedScalarFieldContainer[str]
    lost: bytes
    double_fields: _containers.RepeatedScalarFieldContainer[int]
    doubles: bytes
    integer_fields: _containers.RepeatedScalarFieldContainer[int]
    integers: bytes
    bool_fields: _containers.RepeatedScalarFieldContainer[int]
    bools: bytes
    present: bytes
    driver_unresponsive_call: _containers.RepeatedScalarFieldContainer[str]
    process_gpu_index: _containers.RepeatedScalarFieldContainer[int]
    process_pid: _containers.RepeatedScalarFieldContainer[int]
    process_used_memory_bytes: bytes
    process_used_memory_present: bytes
    def __init__(self, count: _Optional[int] = ..., index: _Optional[_Iterable[int]] = ..., uuid: _Optional[_Iterable[str]] = ..., model: _Optional[_Iterable[str]] = ..., pci_bus_id: _Optional[_Iterable[str]] = ..., lost: _Optional[bytes] = ..., double_fields: _Optional[_Iterable[int]] = ..., doubles: _Optional[bytes] = ..., integer_fields: _Optional[_Iterable[int]] = ..., integers: _Optional[bytes] = ..., bool_fields: _Optional[_Iterable[int]] = ..., bools: _Optional[bytes] = ..., present: _Optional[bytes] = ..., driver_unresponsive_call: _Optional[_Iterable[str]] = ..., process_gpu_index: _Optional[_Iterable[int]] = ..., process_pid: _Optional[_Iterable[int]] = ..., process_used_memory_bytes: _Optional[bytes] = ..., process_used_memory_present: _Optional[bytes] = ...) -> None: ...

class GpuIdentity(_message.Message):
    __slots__ = ("index", "uuid", "model", "pci_bus_id", "hbm_total_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    HBM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    hbm_total_bytes: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., hbm_total_bytes: _Optional[int] = ...) -> None: ...
