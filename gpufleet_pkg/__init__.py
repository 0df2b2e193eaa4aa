"""gpufleet: GPU fleet telemetry and health-repair.

The code lives in the top-level folders DESIGN.md describes (collector/, aggregator/,
repair/, dashboard/, protos/, cli/); pyproject.toml installs each as gpufleet.<folder>.
"""

__version__ = "0.1.0"
