"""Collector credentials on Kubernetes: a projected ServiceAccount token, bound to its pod.

The collector DaemonSet mounts a projected `serviceAccountToken` with the audience
`collector_k8s_audience`; the kubelet issues it for that pod only and rotates it. The
collector sends it as its bearer token. The aggregator asks the API server's TokenReview
whether the token is valid *for that audience*, checks it belongs to the collector's
ServiceAccount, and reads the pod the token is bound to (`authentication.kubernetes.io/pod-name`
and `pod-uid` in the review's extra): the pod must still exist with that uid and run on the
node the collector's hello names. So a token taken from node A's collector can only ever
report as node A, and a token minted for another audience (or any other ServiceAccount) is
refused. The review must name the pod's uid (a replaced pod's token is refused). A positive
answer is remembered for `cache_s` (60 s) per token, never past the token's own `exp`, so
reconnect storms do not become TokenReview storms; a refusal is not remembered. The node comes
from the token, before the stream's Hello is read (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from typing import Any

from gpufleet.aggregator.auth.tokens import AuthError


def _jwt_expiry(token: str) -> float:
    """The `exp` claim (unix seconds) of a JWT the API server has just authenticated; 0 if it
    has none. Read, not verified: TokenReview verified the token."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims.get("exp") or 0)
    except (IndexError, ValueError, TypeError, AttributeError):
        return 0.0


# What this module calls on the API server, as RBAC names it (the ClusterRole grants exactly
# these plus the repair backend's; tests/project/test_deploy.py checks the manifests against both).
API_CALLS = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("", "pods", "get"),
}
_POD_NAME = "authentication.kubernetes.io/pod-name"
_POD_UID = "authentication.kubernetes.io/pod-uid"
_CACHE_MAX = 100_000


class KubernetesCollectorAuth:
    def __init__(
        self, audience: str, service_account: str, kubeconfig: str = "", cache_s: float = 60.0
    ) -> None:
        parts = service_account.split(":")
        if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise ValueError(
                f"collector_k8s_service_account={service_account!r} must look like "
                "system:serviceaccount:NAMESPACE:NAME"
            )
        if not audience:
            raise ValueError("collector_k8s_audience must not be empty: tokens must be minted for gpufleet")
        try:
            import kubernetes  # optional dependency: pip install 'gpufleet[kubernetes]'
        except ImportError as exc:
            raise ValueError(
                "collector_auth=kubernetes needs the official client: pip install 'gpufleet[kubernetes]'"
            ) from exc
        self.audience = audience
        self.service_account = service_account
        self.namespace = parts[2]
        self._k8s = kubernetes
        api_client = self._api_client(kubeconfig)
        self._auth_api = kubernetes.client.AuthenticationV1Api(api_client)
        self._core_api = kubernetes.client.CoreV1Api(api_client)
        self._cache_s = cache_s
        # sha256(token) -> (remembered until, unix s; the pod's node; the token's expiry, ns)
        self._cache: dict[str, tuple[float, str, int]] = {}
        self._lock = threading.Lock()

    def _api_client(self, kubeconfig: str) -> Any:
        k = self._k8s
        configuration = k.client.Configuration()
        if kubeconfig:
            k.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            k.config.load_incluster_config(client_configuration=configuration)
        return k.client.ApiClient(configuration)

    def identify(self, token: str) -> tuple[str, int]:
        """(node, expires_ns) of a live pod's token for this audience, of the collector
        ServiceAccount; AuthError otherwise. Blocking: call from a thread. A positive answer is
        remembered for cache_s, never past the token's own expiry (its `exp` claim)."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.time()
        with self._lock:
            cached = self._cache.get(key)
        if cached and cached[0] > now:
            return cached[1], cached[2]
        pod_node = self._review(token)
        if not pod_node:
            raise AuthError("the token's pod is not scheduled on a node yet")
        expires = _jwt_expiry(token)
        if expires and expires <= now:
            raise AuthError("the collector's Kubernetes token has expired; the kubelet rotates it: reconnect")
        expires_ns = int(expires * 1e9) if expires else 0
        with self._lock:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = (
                min(now + self._cache_s, expires or now + self._cache_s),
                pod_node,
                expires_ns,
            )
        return pod_node, expires_ns

    def _review(self, token: str) -> str:
        """The node of the pod the token is bound to, after checking everything else."""
        k = self._k8s
        body = k.client.V1TokenReview(spec=k.client.V1TokenReviewSpec(token=token, audiences=[self.audience]))
        try:
            review = self._auth_api.create_token_review(body)
        except k.client.ApiException as exc:
            raise AuthError(
                f"cannot check the collector's Kubernetes token: TokenReview answered HTTP {exc.status} "
                f"({exc.reason}); the aggregator's ServiceAccount needs create on tokenreviews"
            ) from exc
        except Exception as exc:  # the API server is unreachable: refuse, the collector retries
            raise AuthError(f"cannot check the collector's Kubernetes token: {exc}") from exc
        status = review.status
        if status is None or not status.authenticated:
            why = (status.error if status is not None else "") or "not authenticated"
            raise AuthError(f"the Kubernetes API server refused the collector's token: {why}")
        if self.audience not in (status.audiences or []):
            raise AuthError(
                f"the collector's token is not for audience {self.audience!r} (it is for "
                f"{status.audiences}); mount a projected serviceAccountToken with that audience"
            )
        user = status.user
        if user is None or user.username != self.service_account:
            raise AuthError(
                f"the token is {getattr(user, 'username', None)!r}'s; only {self.service_account!r} "
                "may report as a collector"
            )
        extra = user.extra or {}
        pod_name = (extra.get(_POD_NAME) or [""])[0]
        pod_uid = (extra.get(_POD_UID) or [""])[0]
        if not pod_name:
            raise AuthError(
                "the token is not bound to a pod (a legacy or TokenRequest token): mount a projected "
                "serviceAccountToken volume in the collector DaemonSet"
            )
        try:
            pod = self._core_api.read_namespaced_pod(pod_name, self.namespace)
        except k.client.ApiException as exc:
            if exc.status == 404:
                raise AuthError(f"the token's pod {self.namespace}/{pod_name} no longer exists") from exc
            raise AuthError(
                f"cannot read the token's pod {self.namespace}/{pod_name}: HTTP {exc.status}"
            ) from exc
        except Exception as exc:
            raise AuthError(f"cannot read the token's pod {self.namespace}/{pod_name}: {exc}") from exc
        if not pod_uid:
            raise AuthError(
                f"the token names pod {self.namespace}/{pod_name} but no pod uid: only a projected "
                "serviceAccountToken (bound to one pod incarnation) is accepted"
            )
        if pod.metadata.uid != pod_uid:
            raise AuthError(
                f"the token's pod {self.namespace}/{pod_name} was replaced (uid {pod.metadata.uid})"
            )
        return str(pod.spec.node_name or "")
