"""The Fleet API's workloads (docs/workloads.md): running and ended workloads, one workload's
report, and GPU-hours by owner. Who may see user names: operators always, viewers only with
`show_user_names` (a user name is personal data; accounts, teams and namespaces are not)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from gpufleet.aggregator.api.base import Refused, RpcGate, UserNames, rpc
from gpufleet.aggregator.api.repair_view import RepairView
from gpufleet.aggregator.auth.tokens import Principal
from gpufleet.aggregator.store import StoreError
from gpufleet.aggregator.workloads.summary import USAGE_DIMENSIONS, Summary, price_of
from gpufleet.aggregator.workloads.wiring import Workloads
from gpufleet.protos import fleet_pb2

MAX_ENDED_LISTED = 5_000
DAY_S = 86_400.0


class WorkloadsApi:
    def __init__(
        self,
        gate: RpcGate,
        workloads: Workloads | None,
        show_user_names: bool,
        repair: RepairView | None = None,
    ) -> None:
        self._repair = repair
        self._gate = gate
        self._workloads = workloads
        self._users = UserNames(show_user_names)

    def _need(self) -> Workloads:
        if self._workloads is None:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "this aggregator keeps no workloads")
        return self._workloads

    def message(self, s: Summary, principal: Principal) -> fleet_pb2.WorkloadSummary:
        sees = self._users.sees(principal)
        out = fleet_pb2.WorkloadSummary(
            scheduler=s.scheduler,
            id=s.id,
            **UserNames.fields(s.user, sees),
            account=s.account,
            partition=s.partition,
            namespace=s.namespace,
            team=s.team,
            name=s.name,
            nodes=list(s.nodes),
            gpus=s.gpus,
            start_unix_s=s.start_unix_s,
            gpu_hours_allocated=s.gpu_hours_allocated,
            gpu_hours_idle=s.gpu_hours_idle,
            hbm_peak_bytes=s.hbm_peak_bytes,
            energy_j=s.energy_j,
            model=s.model,
        )
        for name in ("end_unix_s", "gpu_hours_effective", "util_mean_pct", "util_max_pct", "sm_mean_pct"):
            value = getattr(s, name)
            if value is not None:
                setattr(out, name, value)
        if s.efficiency_pct is not None:
            out.efficiency_pct = s.efficiency_pct
        prices = self._workloads.prices if self._workloads else {}
        price = price_of(s.model, prices) if prices else None
        if price is not None:
            out.cost_allocated = s.gpu_hours_allocated * price
            if s.gpu_hours_effective is not None:
                out.cost_effective = s.gpu_hours_effective * price
        return out

    def waste_now(self, principal: Principal, node: str = "") -> list[fleet_pb2.WasteNow]:
        """The waste findings firing now (repair/waste_desk.py), newest first."""
        controller = self._repair.repair if self._repair is not None else None
        if controller is None:
            return []
        sees = self._users.sees(principal)
        out = []
        for _key, e, nodes in controller.waste.now():
            if node and node not in nodes:
                continue
            owner = e.owner
            out.append(
                fleet_pb2.WasteNow(
                    finding=e.first.code,
                    workload=e.first.workload,
                    nodes=list(nodes) or [e.first.node],
                    gpus=list(e.gpus),
                    **UserNames.fields(owner.user, sees),
                    account=owner.account,
                    namespace=owner.namespace,
                    team=owner.team,
                    since_unix_ns=e.opened_ns,
                    hbm_used_bytes=e.hbm_used_bytes,
                    evidence=e.first.evidence[:500],
                )
            )
        return sorted(out, key=lambda w: -w.since_unix_ns)

    @rpc("viewer")
    async def ListWorkloads(self, request: fleet_pb2.ListWorkloadsRequest, principal: Principal) -> Any:
        w = self._need()
        running = sorted(w.running(), key=lambda s: (s.start_unix_s, s.id))
        if request.node:
            running = [s for s in running if request.node in s.nodes]
        out = fleet_pb2.ListWorkloadsResponse(
            running=[self.message(s, principal) for s in running], scheduler=w.scheduler
        )
        if w.ledger.refreshed_unix_s is not None:
            out.scheduler_read_age_s = max(0.0, time.time() - w.ledger.refreshed_unix_s)
        for live in w.ledger.live():
            for node, gpus in live.job.gpus_by_node.items():
                if request.node and node != request.node:
                    continue
                for gpu in gpus:
                    out.placements.add(node=node, gpu=gpu, scheduler=live.job.scheduler, id=live.job.id)
        out.waste.extend(self.waste_now(principal, request.node))
        if request.ended:
            now = time.time()
            since = request.ended_since_unix_ns / 1e9 if request.ended_since_unix_ns else now - DAY_S
            try:
                ended = await asyncio.to_thread(w.ended, since, now + 1)
            except StoreError as exc:
                raise _store_down(exc) from exc
            if request.node:
                ended = [s for s in ended if request.node in s.nodes]
            ended.sort(key=lambda s: -(s.end_unix_s or 0.0))
            out.ended.extend(self.message(s, principal) for s in ended[:MAX_ENDED_LISTED])
        return out

    @rpc("viewer")
    async def GetWorkload(self, request: fleet_pb2.GetWorkloadRequest, principal: Principal) -> Any:
        w = self._need()
        scheduler = request.scheduler  # "": any scheduler's workload of this id
        found = await asyncio.to_thread(w.find, scheduler, request.id)
        if found is None:
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f"no workload {scheduler + ':' if scheduler else ''}{request.id[:80]} running or ended in "
                "the last 30 days (`gpufleet jobs` lists the running ones)",
            )
        scheduler = found.scheduler
        out = fleet_pb2.WorkloadDetail(summary=self.message(found, principal))
        for node, gpu, seconds, mean, peak, idle, sm, hbm, energy in found.per_gpu:
            row = out.gpus.add(
                node=node,
                gpu=gpu,
                seconds=seconds,
                util_max_pct=peak,
                idle_seconds=idle,
                hbm_peak_bytes=int(hbm),
                energy_j=energy,
            )
            if mean is not None:
                row.util_mean_pct = mean
            if sm is not None:
                row.sm_mean_pct = sm
        live = w.ledger.find(scheduler, request.id)
        if live is not None and live.ended_unix_s is None:
            for node, claim in sorted(live.claims.items()):
                out.claims.add(
                    node=node,
                    gpu_indices=list(claim.gpu_indices),
                    pids=list(claim.pids),
                    process_count=claim.process_count,
                    hbm_used_bytes=claim.hbm_used_bytes,
                )
        return out

    @rpc("viewer")
    async def QueryUsage(self, request: fleet_pb2.UsageRequest, principal: Principal) -> Any:
        w = self._need()
        by = request.by or "account"
        if by not in USAGE_DIMENSIONS:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"usage by {by!r}: use one of {', '.join(USAGE_DIMENSIONS)}"
            )
        if by == "user" and not self._users.sees(principal):
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "usage by user needs the operator role (or show_user_names on the aggregator); "
                "viewers see accounts, teams, namespaces and partitions",
            )
        now_ns = time.time_ns()
        end = request.end_unix_ns or now_ns
        start = request.start_unix_ns or end - int(7 * DAY_S * 1e9)
        if start >= end:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "usage: the start must be before the end")
        try:
            rows = await asyncio.to_thread(w.usage, start / 1e9, end / 1e9, by)
        except StoreError as exc:
            raise _store_down(exc) from exc
        out = fleet_pb2.UsageResponse(by=by, start_unix_ns=start, end_unix_ns=end)
        for r in rows:
            row = out.rows.add(
                owner=r.owner,
                workloads=r.workloads,
                gpu_hours_allocated=r.gpu_hours_allocated,
                gpu_hours_effective=r.gpu_hours_effective,
                gpu_hours_idle=r.gpu_hours_idle,
            )
            for name in ("efficiency_pct", "cost_allocated", "cost_effective"):
                value = getattr(r, name)
                if value is not None:
                    setattr(row, name, value)
        return out


def _store_down(exc: StoreError) -> Refused:
    return Refused(grpc.StatusCode.UNAVAILABLE, f"the history store cannot be read: {exc}")
