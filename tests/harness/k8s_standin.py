"""A stand-in Kubernetes API server for the Kubernetes repair backend's tests.

No Kubernetes API server can run on this machine, so this serves the part of the core/v1
and policy/v1 API that the backend uses, over real HTTP, and checks each request as the real
server would: bearer token, paths, Content-Type of patches (strategic merge for objects,
JSON Patch only for lists), the Eviction body, and PodDisruptionBudgets (minAvailable or
maxUnavailable, counting only Ready pods that are not terminating) — an eviction the budget
does not allow gets 429, as the real eviction subresource answers.

It has the teeth the real one has for a controller: every object carries a resourceVersion,
bumped on each write, and a patch that names an older one gets 409 Conflict; a second writer
can change a node between a client's read and its write (interfere_once); an evicted pod stays
Terminating (deletionTimestamp set) for its grace period; and every request is authorised
against the ClusterRole in deploy/kubernetes/rbac.yaml, so a call the manifest does not allow
gets 403 Forbidden with the real server's message.
Every request is recorded (verb, path, content type, body) for the tests to check, and the
verbs/resources seen are compared with the RBAC the deploy manifests grant.

It also answers TokenReview (authentication.k8s.io/v1) for the tokens it issued with
issue_token(), as the real server does for projected ServiceAccount tokens: unknown tokens and
tokens for another audience are not authenticated (with the real server's error text), a token
whose pod is gone is not either, and an authenticated review carries the ServiceAccount's
username and the bound pod's name, uid and node in `extra`; pods can be read by name."""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from harness.paths import REPO

TOKEN = "standin-token"
USER = "system:serviceaccount:gpufleet:gpufleet-aggregator"
RBAC = REPO / "deploy" / "kubernetes" / "rbac.yaml"


def cluster_role(name: str = "gpufleet-aggregator", kind: str = "ClusterRole") -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the named ClusterRole (or namespaced Role) in
    deploy/kubernetes/rbac.yaml grants."""
    granted = set()
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


def _strategic_merge(target: dict[str, Any], patch: dict[str, Any], merge_keys: dict[str, str]) -> None:
    """Strategic merge patch for the fields the backend touches: maps merge (null deletes),
    lists with a patch merge key (conditions: type) merge by that key, other lists replace."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _strategic_merge(target[key], value, merge_keys)
        elif isinstance(value, list) and key in merge_keys:
            by_key = {item[merge_keys[key]]: item for item in target.get(key, [])}
            for item in value:
                by_key[item[merge_keys[key]]] = {**by_key.get(item[merge_keys[key]], {}), **item}
            target[key] = list(by_key.values())
        else:
            target[key] = copy.deepcopy(value)


class KubeStandin:
    def __init__(self) -> None:
        # Called with a pod after each change the API makes to it (a patch; an eviction, with
        # deletionTimestamp set), as a watch would deliver it.
        self.pod_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdbs: list[dict[str, Any]] = []  # {"namespace", "selector": {labels}, "min_available"}
        self.requests: list[dict[str, Any]] = []
        self.tokens: dict[str, dict[str, Any]] = {}  # issued token -> its claims
        self.granted = cluster_role()  # what the aggregator's ServiceAccount may do anywhere
        # ... and in its own namespace only (the Role: reading the pods its collectors run in)
        self.granted_in = {"gpufleet": cluster_role("gpufleet-aggregator", "Role")}
        self.unavailable = False  # while True every request gets 503
        self.forbidden: list[tuple[str, str, str]] = []  # requests RBAC refused
        self._interfere: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._rv = 1
        self.lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, verb: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urllib.parse.urlparse(self.path)
                record = {
                    "time": time.time(),
                    "verb": verb,
                    "path": url.path,
                    "query": urllib.parse.parse_qs(url.query),
                    "content_type": self.headers.get("Content-Type", ""),
                    "body": json.loads(raw) if raw else None,
                }
                with standin.lock:
                    standin.requests.append(record)
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        record["code"] = 401
                        self._reply(401, _status(401, "Unauthorized", "Unauthorized"))
                        return
                    standin._expire_terminating()
                    attribute = _attribute(record)
                    if standin.unavailable:  # an API server that cannot serve (etcd down, overload)
                        code, body = (
                            503,
                            _status(
                                503,
                                "ServiceUnavailable",
                                "the server is currently unable to handle the request",
                            ),
                        )
                    elif attribute not in standin.granted and attribute not in standin.granted_in.get(
                        _namespace(record), set()
                    ):
                        standin.forbidden.append(attribute)
                        code, body = 403, _forbidden(record, attribute)
                    else:
                        code, body = standin.route(record)
                        body = copy.deepcopy(body)  # the reply is what was read, not a live view
                        if verb == "GET" and code == 200 and body.get("kind") == "Node":
                            second = standin._interfere.pop(body["metadata"]["name"], None)
                            if second is not None:  # another writer, right after this read
                                second(standin.nodes[body["metadata"]["name"]])
                                standin.bump(standin.nodes[body["metadata"]["name"]])
                    record["code"] = code
                self._reply(code, body)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_POST(self) -> None:
                self._handle("POST")

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {  # JSON is YAML: the client reads it as a kubeconfig
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "standin",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "gpufleet", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "gpufleet"}}],
                }
            )
        )
        return path

    # --- objects --------------------------------------------------------------------
    def bump(self, obj: dict[str, Any]) -> None:
        """A write: the object gets the next resourceVersion (callers hold the lock or own it)."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def edit_node(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """A person's or another controller's write to a node (kubectl), as the server does it."""
        with self.lock:
            change(self.nodes[name])
            self.bump(self.nodes[name])

    def interfere_once(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """The next time someone reads this node, another writer changes it right after."""
        with self.lock:
            self._interfere[name] = change

    def add_node(self, name: str) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}, "annotations": {}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.bump(self.nodes[name])

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        labels: dict[str, str] | None = None,
        owner_kind: str = "ReplicaSet",
        grace_s: int = 0,
        ready: bool = True,
        gpus: int = 0,
        started: str = "2026-01-01T00:00:00Z",
        owner_name: str = "",
    ) -> None:
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                # A UUID, as the API server gives every pod (the kubelet names its cgroup by it).
                "uid": str(uuid.uuid4()),
                "labels": labels or {},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": owner_kind,
                        "name": owner_name or f"{name}-owner",
                        "uid": f"uid-{name}",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        **({"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}} if gpus else {}),
                    }
                ],
                "terminationGracePeriodSeconds": grace_s,  # an integer, as the API has it
            },
            "status": {
                "phase": "Running",
                "startTime": started,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        self.bump(self.pods[(namespace, name)])

    def _expire_terminating(self) -> None:
        """Pods whose grace period after eviction is over are gone (the kubelet's part)."""
        now = time.time()
        for key, pod in list(self.pods.items()):
            gone_at = pod["metadata"].get("_gone_at")
            if gone_at is not None and now >= gone_at:
                del self.pods[key]

    def issue_token(
        self,
        namespace: str,
        service_account: str,
        pod: str,
        audiences: list[str],
        expires_in_s: float = 3600.0,
        bind_uid: bool = True,
    ) -> str:
        """A projected ServiceAccount token for a pod (a JWT in shape; only this stand-in can
        read it, as only the real API server can verify a real one). It expires as projected
        tokens do (`exp`, an hour by default); bind_uid False leaves the pod's uid out of the
        review, as a token bound to no pod incarnation would."""
        claims = {
            "exp": int(time.time() + expires_in_s),
            "bind_uid": bind_uid,
            "aud": audiences,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod, "uid": self.pods[(namespace, pod)]["metadata"]["uid"]},
            },
            "n": len(self.tokens),
        }

        def part(obj: object) -> str:
            return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

        token = f"{part({'alg': 'RS256', 'kid': 'standin'})}.{part(claims)}.{part('signature')}"
        self.tokens[token] = claims
        return token

    def _token_review(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        spec = (body or {}).get("spec", {})
        wanted = spec.get("audiences") or []
        claims = self.tokens.get(spec.get("token", ""))
        status: dict[str, Any] = {"authenticated": False, "user": {}}
        if claims is None:
            status["error"] = "[invalid bearer token, square/go-jose: error in cryptographic primitive]"
        elif claims["exp"] <= time.time():
            status["error"] = (
                "[invalid bearer token, square/go-jose/jwt: validation failed, token is expired (exp)]"
            )
        elif wanted and not set(wanted) & set(claims["aud"]):
            status["error"] = (
                f"[invalid bearer token, token audiences {json.dumps(claims['aud'])} is invalid for the "
                f"target audiences {json.dumps(wanted)}, unknown]"
            )
        else:
            ref = claims["kubernetes.io"]
            pod = self.pods.get((ref["namespace"], ref["pod"]["name"]))
            if pod is None or pod["metadata"]["uid"] != ref["pod"]["uid"]:
                status["error"] = f'[invalid bearer token, pod "{ref["pod"]["name"]}" not found]'
            else:
                status = {
                    "authenticated": True,
                    "audiences": [a for a in claims["aud"] if not wanted or a in wanted],
                    "user": {
                        "username": claims["sub"],
                        "uid": f"sa-uid-{claims['sub']}",
                        "groups": [
                            "system:serviceaccounts",
                            f"system:serviceaccounts:{ref['namespace']}",
                            "system:authenticated",
                        ],
                        "extra": {
                            "authentication.kubernetes.io/pod-name": [ref["pod"]["name"]],
                            **(
                                {"authentication.kubernetes.io/pod-uid": [ref["pod"]["uid"]]}
                                if claims["bind_uid"]
                                else {}
                            ),
                            "authentication.kubernetes.io/node-name": [pod["spec"]["nodeName"]],
                        },
                    },
                }
        return 201, {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }

    def add_pdb(
        self,
        namespace: str,
        selector: dict[str, str],
        min_available: int | None = None,
        max_unavailable: int | None = None,
    ) -> None:
        self.pdbs.append(
            {
                "namespace": namespace,
                "selector": selector,
                "min_available": min_available,
                "max_unavailable": max_unavailable,
            }
        )

    # --- the API ----------------------------------------------------------------------
    def route(self, r: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        path, verb = r["path"], r["verb"]
        if m := re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path):
            node = self.nodes.get(m.group(1))
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{m.group(1)}" not found')
            if verb == "GET" and not m.group(2):
                return 200, node
            if verb == "PATCH":
                problem = _check_patch(r)
                if problem:
                    return 415 if "Content-Type" in problem else 400, _status(400, "BadRequest", problem)
                patch = copy.deepcopy(r["body"])  # the recorded request stays as sent
                wanted = (patch.get("metadata") or {}).get("resourceVersion")
                if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                    return 409, _status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on nodes "{m.group(1)}": the object has been '
                        "modified; please apply your changes to the latest version and try again",
                    )
                if m.group(2):  # the status subresource changes only status
                    patch = {"status": patch.get("status", {})}
                else:
                    patch = {k: v for k, v in patch.items() if k != "status"}
                patch.get("metadata", {}).pop("resourceVersion", None)
                _strategic_merge(node, patch, {"conditions": "type"})
                self.bump(node)
                return 200, node
        if path == "/api/v1/nodes" and verb == "GET":
            return 200, {
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {},
                "items": list(self.nodes.values()),
            }
        if path == "/api/v1/pods" and verb == "GET":
            selector = r["query"].get("fieldSelector", [""])[0]
            m = re.fullmatch(r"spec\.nodeName=(.+)", selector)
            if selector == "status.phase=Running":  # every node's running pods (workloads)
                items = [p for p in self.pods.values() if p["status"]["phase"] == "Running"]
            elif not m:
                return 400, _status(400, "BadRequest", f"unsupported field selector {selector!r}")
            else:
                items = [p for p in self.pods.values() if p["spec"]["nodeName"] == m.group(1)]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path)) and verb == "POST":
            return self._evict(m.group(1), m.group(2), r["body"] or {})
        if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path)) and verb in ("GET", "PATCH"):
            pod = self.pods.get((m.group(1), m.group(2)))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{m.group(2)}" not found')
            if verb == "PATCH":  # labels and annotations: what the backend changes on a pod
                problem = _check_patch(r)
                if problem:
                    return 415 if "Content-Type" in problem else 400, _status(400, "BadRequest", problem)
                patch = copy.deepcopy(r["body"])
                if set(patch) - {"metadata"} or set(patch.get("metadata", {})) - {"labels", "annotations"}:
                    return 422, _status(
                        422, "Invalid", "the stand-in patches only a pod's labels and annotations"
                    )
                _strategic_merge(pod, patch, {})
                self.bump(pod)
                for listener in self.pod_listeners:
                    listener(pod)
            return 200, pod
        if path == "/apis/authentication.k8s.io/v1/tokenreviews" and verb == "POST":
            return self._token_review(r["body"])
        return 404, _status(404, "NotFound", f"the stand-in does not serve {verb} {path}")

    def _evict(self, namespace: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            return 400, _status(
                400,
                "BadRequest",
                f"expected a policy/v1 Eviction, got {body.get('apiVersion')}/{body.get('kind')}",
            )
        meta = body.get("metadata", {})
        if meta.get("name") != name or meta.get("namespace", namespace) != namespace:
            return 400, _status(400, "BadRequest", "the Eviction's metadata does not name this pod")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if pod["metadata"].get("deletionTimestamp"):
            return 200, _status(200, "Success", "the pod is already terminating")
        labels = pod["metadata"]["labels"]
        for pdb in self.pdbs:
            if pdb["namespace"] != namespace or any(labels.get(k) != v for k, v in pdb["selector"].items()):
                continue
            covered = [
                p
                for p in self.pods.values()
                if p["metadata"]["namespace"] == namespace
                and all(p["metadata"]["labels"].get(k) == v for k, v in pdb["selector"].items())
            ]
            healthy = sum(1 for p in covered if _ready(p))
            if pdb["min_available"] is not None:
                desired = pdb["min_available"]
            else:
                desired = len(covered) - pdb["max_unavailable"]
            # The eviction API's rule: a Ready pod goes only if the budget still holds without
            # it; a pod that is not Ready only while the budget holds at all.
            after = healthy - 1 if _ready(pod) else healthy
            if after < desired:
                return 429, _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
        grace = float(pod["spec"].get("terminationGracePeriodSeconds") or 0)
        pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if grace <= 0:
            del self.pods[(namespace, name)]
        else:  # Terminating for its grace period, then gone
            pod["metadata"]["_gone_at"] = time.time() + grace
            self.bump(pod)
        for listener in self.pod_listeners:  # the kubelet sends the pod's containers SIGTERM now
            listener(pod)
        return 201, _status(201, "Success", "evicted")

    def calls(self) -> set[tuple[str, str, str]]:
        """(API group, resource[/subresource], verb) of every request, as RBAC names them."""
        return {_attribute(r) for r in self.requests}


def _attribute(r: dict[str, Any]) -> tuple[str, str, str]:
    """A request's RBAC attributes: (API group, resource[/subresource], verb)."""
    verbs = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}
    segments = r["path"].split("/")
    group, parts = ("", segments[3:]) if segments[1] == "api" else (segments[2], segments[4:])
    if parts and parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "")
    verb = "list" if r["verb"] == "GET" and len(parts) == 1 else verbs[r["verb"]]
    return group, resource, verb


def _namespace(r: dict[str, Any]) -> str:
    """The namespace a request is in ("" for cluster-scoped requests)."""
    segments = r["path"].split("/")
    parts = segments[3:] if segments[1] == "api" else segments[4:]
    return parts[1] if len(parts) > 2 and parts[0] == "namespaces" else ""


def _forbidden(r: dict[str, Any], attribute: tuple[str, str, str]) -> dict[str, Any]:
    group, resource, verb = attribute
    name = r["path"].rstrip("/").split("/")[-1]
    return _status(
        403,
        "Forbidden",
        f'{resource.split("/")[0]} "{name}" is forbidden: User "{USER}" cannot {verb} resource '
        f'"{resource}" in API group "{group}" at the cluster scope',
    )


def _ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _check_patch(r: dict[str, Any]) -> str:
    ctype = r["content_type"].split(";")[0].strip()
    body = r["body"]
    if ctype == "application/json-patch+json":
        return "" if isinstance(body, list) else "a JSON Patch must be a list of operations"
    if ctype in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
        return "" if isinstance(body, dict) else "a merge patch must be a JSON object"
    return f"Content-Type {ctype!r} is not a patch type"


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Success" if code < 300 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
