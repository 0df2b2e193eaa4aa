"""Replicas: this aggregator's part in a control plane shared with others (lease, heartbeats,
the shared live view, commands routed to the replica holding a node's stream)."""
