"""The Fleet API client and what both front ends (the `gpufleet` CLI and the dashboard) make of
its answers: row names and units, series labels, the history and events CSV, time parsing.
Two front ends on one client; it imports nothing of ours but protos/ and common/."""
