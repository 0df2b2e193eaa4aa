"""A storm of corrected ECC errors on one GPU while the node's other GPUs show none: each GPU's
rate averaged over the window, judged against its peers' median (so one GPU's storm cannot hide
itself by moving the yardstick). The slowness rule, also judged against peers, is slowness.py."""

from __future__ import annotations

import statistics

from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule
from gpufleet.repair.rules.windows import TrailingWindows, WindowMean

# Corrected errors: a GPU storms when its rate is at least the policy's threshold (errors/s)
# and this many times its peers' median rate.
STORM_PEER_FACTOR = 10.0


class EccCorrectedStorm(Rule):
    """One GPU's corrected-error rate, averaged over the rule's window, at least the threshold
    and STORM_PEER_FACTOR times its peers' (averaged alike): a storm that dips under the
    threshold in a sample or two is still a storm (repair/rules/windows.py)."""

    name = "ecc_corrected_storm"
    watch_fields = ("ecc_sbe_rate_per_s",)

    def __init__(self) -> None:
        self._rates = TrailingWindows()

    def look_again_at_ns(self, node: str, entry: Entry) -> int | None:
        return self._rates.covered_at_ns(node, int(entry.window_s * 1e9), lambda v: v >= entry.threshold)

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        window_ns = int(entry.window_s * 1e9)
        t = snap.sample_time_ns or now_ns
        means: dict[int, WindowMean] = {}
        for index, g in snap.gpus.items():
            key = (snap.node, index)
            if g.lost or not g.HasField("ecc_sbe_rate_per_s"):
                self._rates.forget(key)
                continue
            over = self._rates.observe(key, t, g.ecc_sbe_rate_per_s, window_ns)
            if over is not None:
                means[index] = over
        found = []
        for index, over in sorted(means.items()):
            if over.mean < max(entry.threshold, 1e-9):
                continue
            peers = [m.mean for i, m in means.items() if i != index]
            peer_median = statistics.median(peers) if peers else 0.0
            if peers and over.mean < STORM_PEER_FACTOR * peer_median:
                continue  # the whole node errs alike: not one GPU's storm
            evidence = (
                f"{over.mean:.0f} corrected ECC errors/s averaged over {entry.window_s:g} s "
                f"(threshold {entry.threshold:g}/s; median of {len(peers)} peer(s) {peer_median:.0f}/s)"
            )
            # Evidence since the window's start: the evaluator's persistence window is then met
            # by the rate's own (the rate over the whole window is the "sustained").
            found.append(entry.finding(snap.node, index, self.name, evidence, over.start_ns))
        return found
