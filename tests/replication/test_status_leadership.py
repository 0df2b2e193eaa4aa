"""What GetStatus says of leadership is one consistent statement (the issue: under load a new
leader answered "I lead" with its predecessor's epoch, so a test saw the epoch move later with
no election). The window is between an election and the next read of the lease; here it is
set up exactly, with the real LeaseInfo a replica holds."""

from __future__ import annotations

from gpufleet.aggregator.status import leadership_fields
from gpufleet.repair.state import LeaseInfo

S = 10**9


def test_a_new_leader_names_itself_and_its_own_epoch_before_it_reads_the_lease_again() -> None:
    predecessor = LeaseInfo(holder="agg-0", epoch=1, expires_ns=100 * S, now_ns=101 * S)  # expired
    said = leadership_fields("agg-2", 2, predecessor)
    assert said == {"repair_leader": True, "leader": "agg-2", "leader_epoch": 2, "leader_lease_left_s": 0.0}
    own = LeaseInfo(holder="agg-2", epoch=2, expires_ns=103 * S, now_ns=101 * S)
    assert leadership_fields("agg-2", 2, own)["leader_lease_left_s"] == 2.0


def test_a_follower_says_the_lease_it_read() -> None:
    held = LeaseInfo(holder="agg-2", epoch=2, expires_ns=103 * S, now_ns=101 * S)
    assert leadership_fields("agg-1", None, held) == {
        "repair_leader": False,
        "leader": "agg-2",
        "leader_epoch": 2,
        "leader_lease_left_s": 2.0,
    }
    expired = LeaseInfo(holder="agg-2", epoch=2, expires_ns=100 * S, now_ns=101 * S)
    assert leadership_fields("agg-1", None, expired)["leader"] == ""
    assert leadership_fields("agg-1", None, None)["leader_epoch"] == 0
