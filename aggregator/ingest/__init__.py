"""Ingest: collector streams, the checks on what they send, the schema reports are stored as,
the group-commit writer and its spool, the worker processes, the fan-out to listeners."""
