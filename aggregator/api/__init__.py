"""The Fleet API (gRPC): what the dashboard and the CLI see of the fleet, by RPC group."""
