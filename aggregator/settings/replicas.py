"""Replicas: the shared control plane, this replica's name and address, the repair leader's
lease and how often the live view is shared."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting


@dataclass
class ReplicaSettings:
    control_plane: str = setting(
        "sqlite",
        "where repair state and the fleet's live view are kept: sqlite (DATA_DIR/repair.sqlite3, one "
        "box) or a postgresql://USER@HOST:5432/DB URL that every replica shares (password in the URL, "
        "PGPASSWORD or ~/.pgpass); replicas elect one repair leader through it",
    )
    replica_id: str = setting(
        "", "this aggregator's name among replicas (empty: the host name); each replica needs its own"
    )
    replica_advertise: str = setting(
        "",
        "the Fleet API address other replicas reach this one at, to forward repair actions to the "
        "leader (empty: the bound fleet address, with the host name for 0.0.0.0)",
    )
    leader_lease_s: float = setting(
        10.0,
        "the repair leader's lease with control_plane = postgresql: a leader that stops renewing it "
        "(killed, paused, cut off) is replaced within this, and its later writes are refused",
    )
    live_sync_s: float = setting(
        1.0,
        "how often a replica writes the live state of the nodes it holds to the control plane, "
        "reads the other replicas' and passes on commands for its streams",
    )

    @property
    def replicated(self) -> bool:
        """Replicas share a PostgreSQL control plane (else one box, SQLite)."""
        return self.control_plane.startswith(("postgresql://", "postgres://"))

    @property
    def control_plane_call_timeout_s(self) -> float:
        """How long any one control-plane call waits for PostgreSQL's answer: a quarter of the
        lease, at most 1 s (a local PostgreSQL answers the control plane's statements in
        milliseconds; the event loop waits no longer than this per stall), so a leader whose
        renewal hangs learns it in time to stop acting before its lease runs out
        (docs/architecture.md "When the control plane hangs")."""
        return min(1.0, self.leader_lease_s / 4)

    @property
    def replica_name(self) -> str:
        import socket

        return self.replica_id or socket.gethostname()

    def check_replicas(self) -> None:
        require(
            self.replicated or self.control_plane == "sqlite",
            f"control_plane={self.control_plane!r}: use sqlite or a postgresql://USER@HOST:PORT/DB URL",
        )
        require(
            1 <= self.leader_lease_s <= 300,
            f"leader_lease_s={self.leader_lease_s:g} must be between 1 and 300 seconds",
        )
        require(
            0.05 <= self.live_sync_s <= min(60.0, self.leader_lease_s),
            f"live_sync_s={self.live_sync_s:g} must be between 0.05 and 60 seconds and at most "
            f"leader_lease_s ({self.leader_lease_s:g})",
        )
        require(
            not self.replica_advertise or ":" in self.replica_advertise,
            f"replica_advertise={self.replica_advertise!r} must be host:port or empty",
        )
