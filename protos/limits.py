"""The sizes of the ingest contract that both ends must agree on: the aggregator refuses a
message past them (aggregator/ingest/wire_rules.py), and the collector never builds one (it lists at
most MAX_PROCESSES_PER_GPU processes of a GPU, with process_count saying how many there are).
docs/security.md "Bounded per-node state"."""

MAX_GPUS_PER_NODE = 64
MAX_ENGINES_PER_REPORT = 64
MAX_EVENTS_PER_REPORT = 1000
MAX_PROCESSES_PER_GPU = 256
# Workloads a report names (NodeReport.workloads) and the processes each lists: a node has far
# fewer jobs or pods on its GPUs; a workload's process_count says how many it has in all.
MAX_WORKLOADS_PER_REPORT = 256
MAX_PIDS_PER_WORKLOAD = 16
