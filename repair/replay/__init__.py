"""Policy replay: what would automatic repair have done on this fault history?
(docs/architecture.md "Policy replay")."""
