"""The fleet: its live view, roll-ups of its history, events read back, the history export of
repair records, the store's history as a replay's input."""
