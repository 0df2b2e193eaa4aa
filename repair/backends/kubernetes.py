"""Kubernetes through the official client: cordon = spec.unschedulable plus a NoSchedule
taint plus a node condition; drain = the Eviction API, so PodDisruptionBudgets are respected
(an eviction a budget refuses is retried on the next pass, never forced).

The automation marks what it did with the taint gpufleet.io/unhealthy and the annotation
gpufleet.io/cordoned-by; it only uncordons a node that carries them. A node cordoned by
`kubectl cordon` (no marker) is a person's, and stays as it is.

Every write is read-modify-write on a fresh GET with the node's resourceVersion in the patch:
the API server answers 409 Conflict when someone changed the node in between, and the write is
redone on a fresh read (up to CONFLICT_RETRIES times). Taints are merged: ours is added to, or
removed from, the node's current list; taints others put there stay.

Load: one LIST of nodes at most every repair_observe_interval_s; in between, one GET per node
with a workflow under way, and one GET before each write.

Graceful drain (docs/repair.md "Graceful drain"): serving pods carry the label
gpufleet.io/in-rotation=true, and the Service or InferencePool that sends them requests
selects on it. Before the drain evicts anything, the pods on the node that carry it are
patched to "false" (their endpoints leave the Service; in-flight requests finish), and the
eviction comes once the engines report nothing running or waiting. An uncordon (a cancelled
drain) puts back the pods the automation took out (annotation gpufleet.io/out-of-rotation-by).
The eviction uses each pod's own terminationGracePeriodSeconds: set it above the engine's own
drain (vLLM's --shutdown-timeout). A replacement pod comes from its template, label as it was.

API calls made (the RBAC in deploy/ must allow exactly these):
  nodes: get, list, patch  nodes/status: patch
  pods: list, patch        pods/eviction: create
"""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass
from typing import Any, ClassVar

from gpufleet.common.settings import setting
from gpufleet.repair.backends.base import (
    AUTOMATION_PREFIX,
    Backend,
    BackendError,
    BackendSettings,
    DrainProgress,
    NotOurs,
    Observed,
    scheduler_node,
    scheduler_nodes,
)

TAINT_KEY = "gpufleet.io/unhealthy"
ANNOTATION = "gpufleet.io/cordoned-by"
CONDITION = "GpufleetHealthy"
REASON_ANNOTATION = "gpufleet.io/reason"
ROTATION_LABEL = "gpufleet.io/in-rotation"  # on serving pods; their Service selects on it = "true"
ROTATION_ANNOTATION = "gpufleet.io/out-of-rotation-by"  # set where the automation took a pod out
CONFLICT_RETRIES = 5
API_CALLS = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "pods", "list"),
    ("", "pods", "patch"),
    ("", "pods/eviction", "create"),
}


def _client() -> Any:
    try:
        import kubernetes  # optional dependency: pip install 'gpufleet[kubernetes]'
    except ImportError as exc:
        raise ValueError(
            "the kubernetes repair backend needs the official client: pip install 'gpufleet[kubernetes]'"
        ) from exc
    return kubernetes


@dataclass
class KubernetesSettings(BackendSettings):
    chosen_by: ClassVar[str] = "repair_backend = kubernetes"
    repair_kubeconfig: str = setting(
        "", "kubeconfig for the kubernetes backend (empty: the in-cluster service account)"
    )


class KubernetesBackend(Backend):
    name = "kubernetes"
    help = "unschedulable, a taint and a condition; evictions"
    settings = KubernetesSettings

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> Backend:
        return cls(settings.repair_kubeconfig, settings.repair_hook_timeout_s)

    def __init__(self, kubeconfig: str = "", timeout_s: float = 30.0) -> None:
        k8s = _client()
        if kubeconfig:
            api_client = k8s.config.new_client_from_config(config_file=kubeconfig)
        else:
            k8s.config.load_incluster_config()
            api_client = k8s.client.ApiClient()
        self._k8s = k8s
        self._core = k8s.client.CoreV1Api(api_client)
        self._timeout_s = timeout_s

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=self._timeout_s, **kwargs)
        except self._k8s.client.exceptions.ApiException as exc:
            raise BackendError(
                f"Kubernetes {what}: HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}", exc.status
            ) from exc
        except Exception as exc:  # urllib3 connection errors and the like
            raise BackendError(f"Kubernetes {what}: {exc}") from exc

    def _seen(self, node: Any) -> Observed:
        annotations = node.metadata.annotations or {}
        ours = any(t.key == TAINT_KEY for t in node.spec.taints or []) and (
            annotations.get(ANNOTATION) == "automation"
        )
        reason = annotations.get(REASON_ANNOTATION, "") or ("" if ours else "cordoned outside gpufleet")
        return Observed(cordoned=bool(node.spec.unschedulable), ours=ours, reason=reason)

    async def observe(self, nodes: list[str], whole_fleet: bool = True) -> dict[str, Observed]:
        nodes = scheduler_nodes(nodes)
        if not nodes:
            return {}
        if whole_fleet:  # one LIST rather than a GET per node
            listed = (await self._call("list nodes", self._core.list_node)).items
        else:
            listed = []
            for name in nodes:
                try:
                    listed.append(await self._call(f"get node {name}", self._core.read_node, name))
                except BackendError as exc:
                    if exc.status != 404:
                        raise
        wanted = set(nodes)
        return {n.metadata.name: self._seen(n) for n in listed if n.metadata.name in wanted}

    async def _write(self, node: str, change: Any) -> None:
        """change(current node) → the patch body, or None for nothing to do; sent with the
        resourceVersion it was read at, and redone on a fresh read after a 409 Conflict."""
        for attempt in range(CONFLICT_RETRIES):
            current = await self._call(f"get node {node}", self._core.read_node, node)
            body = change(current)
            if body is None:
                return
            body.setdefault("metadata", {})["resourceVersion"] = current.metadata.resource_version
            try:
                await self._call(f"patch node {node}", self._core.patch_node, node, body)
                return
            except BackendError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
        raise BackendError(f"node {node} kept changing under gpufleet: {CONFLICT_RETRIES} conflicts")

    def _taints(self, node: Any, add: Any = None) -> list[Any]:
        kept = [t for t in node.spec.taints or [] if t.key != TAINT_KEY]
        ser = self._core.api_client.sanitize_for_serialization
        return [ser(t) for t in kept] + ([ser(add)] if add is not None else [])

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        scheduler_node(node, "kubernetes")
        value = "automation" if automation else "manual"
        taint = self._k8s.client.V1Taint(key=TAINT_KEY, value=value, effect="NoSchedule")

        def change(current: Any) -> dict[str, Any]:
            seen = self._seen(current)
            if automation and seen.cordoned and not seen.ours:
                raise NotOurs(node, seen.reason)
            return {
                "metadata": {"annotations": {ANNOTATION: value, REASON_ANNOTATION: reason[:1000]}},
                "spec": {"unschedulable": True, "taints": self._taints(current, taint)},
            }

        await self._write(node, change)
        await self._set_condition(node, healthy=False, reason=reason)

    async def _set_condition(self, node: str, healthy: bool, reason: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": CONDITION,
            "status": "True" if healthy else "False",
            "reason": "Healthy" if healthy else "GpuFault",
            "message": reason[:1000],
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }
        await self._call(
            f"set condition on node {node}",
            self._core.patch_node_status,
            node,
            {"status": {"conditions": [condition]}},
        )

    async def leave_rotation(self, node: str, ports: list[int]) -> str | None:
        scheduler_node(node, "kubernetes")
        pods = await self._pods_on(node)
        serving = [p for p in pods.items if ROTATION_LABEL in (p.metadata.labels or {})]
        if not serving:
            return None
        for pod in serving:
            if pod.metadata.labels[ROTATION_LABEL] == "false":
                continue
            await self._set_rotation(pod, in_rotation=False)
        names = ", ".join(f"{p.metadata.namespace}/{p.metadata.name}" for p in serving)
        return f"{len(serving)} pod(s) out of rotation ({ROTATION_LABEL}=false): {names}"[:500]

    async def drain(self, node: str) -> DrainProgress:
        scheduler_node(node, "kubernetes")
        pods = await self._pods_on(node)
        blocked, evicted, terminating = [], 0, 0
        for pod in pods.items:
            owners = pod.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners):
                continue  # DaemonSet pods stay: they would be recreated on the node anyway
            if (pod.metadata.annotations or {}).get("kubernetes.io/config.mirror"):
                continue  # static pods are the kubelet's
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                continue
            if pod.metadata.deletion_timestamp is not None:
                terminating += 1  # evicted: still in its grace period
                continue
            eviction = self._k8s.client.V1Eviction(
                api_version="policy/v1",
                kind="Eviction",  # the API server refuses an Eviction body without its kind
                metadata=self._k8s.client.V1ObjectMeta(
                    name=pod.metadata.name, namespace=pod.metadata.namespace
                ),
            )
            try:
                await self._call(
                    f"evict {pod.metadata.namespace}/{pod.metadata.name}",
                    self._core.create_namespaced_pod_eviction,
                    pod.metadata.name,
                    pod.metadata.namespace,
                    eviction,
                )
                evicted += 1
            except BackendError as exc:
                if exc.status == 404:
                    continue  # already gone
                if exc.status == 429:
                    blocked.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
                    continue  # a PodDisruptionBudget says not now: try again next pass
                raise
        if blocked:
            return DrainProgress(False, f"eviction refused by a disruption budget for {', '.join(blocked)}")
        if evicted or terminating:
            return DrainProgress(
                False, f"{evicted} pod(s) evicted now, {terminating} terminating within their grace period"
            )
        return DrainProgress(True, "no pods left to evict")

    async def uncordon(self, node: str, automation: bool = True) -> None:
        scheduler_node(node, "kubernetes")

        def change(current: Any) -> dict[str, Any] | None:
            seen = self._seen(current)
            mine = any(t.key == TAINT_KEY for t in current.spec.taints or [])
            if not seen.cordoned and not mine:
                return None  # already in service
            if automation and seen.cordoned and not seen.ours:
                raise NotOurs(node, seen.reason)
            return {
                "metadata": {"annotations": {ANNOTATION: None, REASON_ANNOTATION: None}},
                "spec": {"unschedulable": False, "taints": self._taints(current)},
            }

        await self._write(node, change)
        await self._set_condition(node, healthy=True, reason=f"{AUTOMATION_PREFIX} returned to service")
        await self._back_in_rotation(node)

    async def _back_in_rotation(self, node: str) -> None:
        """Pods the automation took out of rotation and that are still there (a drain cancelled
        before its eviction) take requests again; a pod a person took out stays out."""
        pods = await self._pods_on(node)
        for pod in pods.items:
            if (pod.metadata.annotations or {}).get(ROTATION_ANNOTATION) != "automation":
                continue
            await self._set_rotation(pod, in_rotation=True)

    async def _pods_on(self, node: str) -> Any:
        return await self._call(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )

    async def _set_rotation(self, pod: Any, in_rotation: bool) -> None:
        """The pod's rotation label; out of rotation, marked as the automation's doing."""
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        await self._call(
            f"return {where} to rotation" if in_rotation else f"take {where} out of rotation",
            self._core.patch_namespaced_pod,
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "metadata": {
                    "labels": {ROTATION_LABEL: "true" if in_rotation else "false"},
                    "annotations": {ROTATION_ANNOTATION: None if in_rotation else "automation"},
                }
            },
        )
