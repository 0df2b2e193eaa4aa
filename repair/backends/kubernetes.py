"""Kubernetes through the official client: cordon = spec.unschedulable plus a NoSchedule
taint plus a node condition; drain = the Eviction API, so PodDisruptionBudgets are respected
(an eviction a budget refuses is retried on the next pass, never forced).

The automation marks what it did with the taint gpufleet.io/unhealthy and the annotation
gpufleet.io/cordoned-by; it only uncordons a node that carries them. A node cordoned by
`kubectl cordon` (no marker) is a person's, and stays as it is.

API calls made (the RBAC in deploy/ must allow exactly these):
  nodes: get, list, patch  nodes/status: patch
  pods: list               pods/eviction: create
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from gpufleet.repair.backends.base import AUTOMATION_PREFIX, Backend, BackendError, DrainProgress, Observed

TAINT_KEY = "gpufleet.io/unhealthy"
ANNOTATION = "gpufleet.io/cordoned-by"
CONDITION = "GpufleetHealthy"
API_CALLS = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "pods", "list"),
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


class KubernetesBackend(Backend):
    name = "kubernetes"

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
        self._taints: dict[str, list[Any]] = {}

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=self._timeout_s, **kwargs)
        except self._k8s.client.exceptions.ApiException as exc:
            raise BackendError(
                f"Kubernetes {what}: HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
            ) from exc
        except Exception as exc:  # urllib3 connection errors and the like
            raise BackendError(f"Kubernetes {what}: {exc}") from exc

    async def observe(self, nodes: list[str]) -> dict[str, Observed]:
        # One LIST per pass rather than a GET per node: a pass costs one request at any fleet size.
        listed = await self._call("list nodes", self._core.list_node)
        self._taints = {n.metadata.name: list(n.spec.taints or []) for n in listed.items}
        wanted = set(nodes)
        seen = {}
        for node in listed.items:
            if node.metadata.name not in wanted:
                continue
            taints = node.spec.taints or []
            ours = any(t.key == TAINT_KEY for t in taints) and (
                (node.metadata.annotations or {}).get(ANNOTATION) == "automation"
            )
            reason = (node.metadata.annotations or {}).get("gpufleet.io/reason", "")
            seen[node.metadata.name] = Observed(
                cordoned=bool(node.spec.unschedulable), ours=ours, reason=reason
            )
        return seen

    async def cordon(self, node: str, reason: str, automation: bool) -> None:
        known = self._taints.pop(node, None)  # from this pass's LIST; else read the node now
        if known is None:
            known = (await self._call(f"get node {node}", self._core.read_node, node)).spec.taints or []
        taints = [t for t in known if t.key != TAINT_KEY]
        value = "automation" if automation else "manual"
        taints.append(self._k8s.client.V1Taint(key=TAINT_KEY, value=value, effect="NoSchedule"))
        body = {
            "metadata": {"annotations": {ANNOTATION: value, "gpufleet.io/reason": reason[:1000]}},
            "spec": {
                "unschedulable": True,
                "taints": [self._core.api_client.sanitize_for_serialization(t) for t in taints],
            },
        }
        await self._call(f"cordon node {node}", self._core.patch_node, node, body)
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

    async def drain(self, node: str) -> DrainProgress:
        pods = await self._call(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        blocked, evicted = [], 0
        for pod in pods.items:
            owners = pod.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners):
                continue  # DaemonSet pods stay: they would be recreated on the node anyway
            if (pod.metadata.annotations or {}).get("kubernetes.io/config.mirror"):
                continue  # static pods are the kubelet's
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
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
                if "HTTP 404" in str(exc):
                    continue  # already gone
                if "HTTP 429" in str(exc):
                    blocked.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
                    continue  # a PodDisruptionBudget says not now: try again next pass
                raise
        if blocked:
            return DrainProgress(False, f"eviction refused by a disruption budget for {', '.join(blocked)}")
        if evicted:
            return DrainProgress(False, f"{evicted} pod(s) being evicted")
        return DrainProgress(True, "no pods left to evict")

    async def uncordon(self, node: str) -> None:
        current = await self._call(f"get node {node}", self._core.read_node, node)
        taints = [
            self._core.api_client.sanitize_for_serialization(t)
            for t in (current.spec.taints or [])
            if t.key != TAINT_KEY
        ]
        body = {
            "metadata": {"annotations": {ANNOTATION: None, "gpufleet.io/reason": None}},
            "spec": {"unschedulable": False, "taints": taints},
        }
        await self._call(f"uncordon node {node}", self._core.patch_node, node, body)
        await self._set_condition(node, healthy=True, reason=f"{AUTOMATION_PREFIX} returned to service")
