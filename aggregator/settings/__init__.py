"""The aggregator's settings, by area: serving (addresses, TLS, who may connect), ingest (what one
node may cost), the history store, repair (policy, rails, backends, alerts), replicas. Each area
is a dataclass with its own checks, and includes the settings its plug-ins declare (a cordon
backend's, an alert sink's, a store's: common/registry.py); aggregator/config.py puts the areas
together. Layering (file, environment, flags) is done by the CLI from each field's metadata."""

from __future__ import annotations

from gpufleet.common.settings import require, setting

__all__ = ["require", "setting"]
