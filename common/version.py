"""gpufleet's version: the one place it is written (setup.py reads it for the wheel)."""

__version__ = "0.1.0"
