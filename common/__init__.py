"""Small helpers every component may use (files written privately, secrets kept out of text,
a bounded HTTP server). It imports nothing of gpufleet but itself."""
