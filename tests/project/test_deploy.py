"""deploy/ checked offline: every manifest against the Kubernetes schema, the RBAC against the
calls the Kubernetes backend makes, the systemd units with systemd-analyze, the Dockerfile with
hadolint — and the aggregator and a collector started exactly as the units and the manifests
say (same arguments, same environment), on loopback, with reports flowing."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpufleet.aggregator.auth.kubernetes import API_CALLS as K8S_AUTH_CALLS
from gpufleet.protos import fleet_pb2, fleet_pb2_grpc
from gpufleet.repair.backends.kubernetes import API_CALLS
from harness.k8s_standin import KubeStandin
from harness.paths import REPO
from harness.pki import Pki
from harness.processes import Cluster, free_port
from harness.waiting import wait_until

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


AUTOSCALING = K8S / "autoscaling"  # examples to adapt, not part of the kustomization


def manifests() -> list[Path]:
    return sorted(
        p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and AUTOSCALING not in p.parents
    )


def by_kind(kind: str, name: str) -> dict[str, Any]:
    for path in manifests():
        for d in docs(path):
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in {K8S}")


def test_every_manifest_validates_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    for path in manifests():
        for d in docs(path):
            kubernetes_validate.validate(d, "1.33.0", strict=True)  # raises ValidationError, naming the field
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"}
    component = yaml.safe_load((K8S / "components" / "influxdb" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["influxdb.yaml"]


def test_the_autoscaling_examples_validate_and_scale_on_the_pool_signal() -> None:
    """deploy/kubernetes/autoscaling/: the KEDA ScaledObject against its schema (a CRD: written
    from KEDA's, tests/project/schemas/), the HPA and the adapter's ConfigMap against
    Kubernetes', and both scale on the recording rule gpufleet-serving.yml defines."""
    import jsonschema
    import kubernetes_validate

    schema = json.loads(
        (REPO / "tests" / "project" / "schemas" / "keda-scaledobject.schema.json").read_text()
    )
    (scaled,) = docs(AUTOSCALING / "keda-scaledobject.yaml")
    jsonschema.validate(scaled, schema)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    assert "gpufleet:pool_replicas_wanted{" in trigger["metadata"]["query"]
    broken = {**scaled, "spec": {**scaled["spec"], "triggers": [{"type": "prometheus"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)  # the schema has teeth: a trigger without metadata
    config_map, hpa = docs(AUTOSCALING / "hpa-prometheus-adapter.yaml")
    for d in (config_map, hpa):
        kubernetes_validate.validate(d, "1.33.0", strict=True)
    (rule,) = yaml.safe_load(config_map["data"]["config.yaml"])["externalRules"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    recorded = {
        r["record"]
        for g in yaml.safe_load((DEPLOY / "prometheus" / "gpufleet-serving.yml").read_text())["groups"]
        for r in g["rules"]
    }
    assert "gpufleet:pool_replicas_wanted" in recorded and rule["seriesQuery"].startswith(
        "gpufleet:pool_replicas_wanted{"
    )


def _grants(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in doc["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_rbac_allows_exactly_what_the_aggregator_calls() -> None:
    cluster_wide = _grants(by_kind("ClusterRole", "gpufleet-aggregator"))
    namespaced = by_kind("Role", "gpufleet-aggregator")
    assert cluster_wide | _grants(namespaced) == API_CALLS | K8S_AUTH_CALLS
    # Reading a collector's pod (the token check) is granted in gpufleet only, not cluster-wide.
    assert namespaced["metadata"]["namespace"] == "gpufleet"
    assert ("", "pods", "get") in _grants(namespaced) and ("", "pods", "get") not in cluster_wide
    aggregator = by_kind("StatefulSet", "gpufleet-aggregator")
    account = aggregator["spec"]["template"]["spec"]["serviceAccountName"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        assert by_kind(kind, "gpufleet-aggregator")["subjects"][0]["name"] == account


def test_credentials_live_in_secrets_only() -> None:
    config = by_kind("ConfigMap", "gpufleet-config")["data"]["gpufleet.toml"]
    for word in ("token =", "password =", "secret ="):
        assert word not in config
    for path in manifests():
        for d in docs(path):
            for container in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                for env in container.get("env", []):
                    if any(w in env["name"] for w in ("TOKEN", "PASSWORD", "SECRET")) and "value" in env:
                        assert env["value"].startswith("/"), (
                            f"{path.name}: {env['name']} is a literal credential"
                        )
    assert "secret" not in (DEPLOY / "Dockerfile").read_text().lower().replace("secrets file", "")


def test_collector_runs_on_gpu_nodes_only_with_what_nvml_and_xids_need() -> None:
    spec = by_kind("DaemonSet", "gpufleet-collector")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and spec["hostPID"] is True
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert security["allowPrivilegeEscalation"] is False and "privileged" not in security
    assert {"livenessProbe", "readinessProbe", "resources"} <= set(container)
    assert any(v.get("hostPath", {}).get("path") == "/dev/kmsg" for v in spec["volumes"])
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The TLS Secret reaches a GPU node with its CA only, never the aggregator's key.
    (tls,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "gpufleet-tls"]
    assert [i["key"] for i in tls["secret"]["items"]] == ["ca.crt"]


def test_every_datastore_and_the_dashboard_are_behind_a_network_policy() -> None:
    """InfluxDB, PostgreSQL and the dashboard take connections only from who needs them; an
    InfluxDB of ours runs with authentication on."""
    for path, component, allowed in (
        (K8S / "components" / "influxdb" / "influxdb.yaml", "influxdb", {"aggregator"}),
        (K8S / "components" / "postgresql" / "postgresql.yaml", "postgresql", {"aggregator"}),
        (K8S / "networkpolicy.yaml", "dashboard", set()),
    ):
        (policy,) = [
            d
            for d in docs(path)
            if d["kind"] == "NetworkPolicy"
            and d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        ]
        sources = [src for rule in policy["spec"]["ingress"] for src in rule["from"]]
        pods = {
            s["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for s in sources
            if "podSelector" in s
        }
        assert pods == allowed, (component, pods)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    influx = {d["kind"]: d for d in docs(K8S / "components" / "influxdb" / "influxdb.yaml")}
    env = {e["name"]: e for e in influx["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["INFLUXDB_HTTP_AUTH_ENABLED"]["value"] == "true"
    assert env["INFLUXDB_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "gpufleet-influxdb"


UNITS = ("gpufleet-aggregator.service", "gpufleet-collector.service", "gpufleet-gpu-reset.service")


def _verify(unit: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env)


def test_systemd_units_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: scripts/install-test-deps.sh installs Debian's systemd")
    gpufleet = Path(sys.executable).with_name("gpufleet")
    assert sorted(p.name for p in SYSTEMD.glob("*.service")) == sorted(UNITS)
    for name in UNITS:
        unit = SYSTEMD / name
        # Only the install path differs from a real host: verify checks that ExecStart exists.
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/opt/gpufleet/venv/bin/gpufleet", str(gpufleet)))
        out = _verify(copy)
        assert out.returncode == 0 and not out.stderr.strip(), f"{unit.name}: {out.stderr}"
        text = unit.read_text()
        for option in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "Restart=on-failure"):
            assert option in text, f"{unit.name} lacks {option}"
        if name != "gpufleet-gpu-reset.service":  # the one unit that runs as root (below)
            parser = configparser.ConfigParser(strict=False, interpolation=None)
            parser.read_string(text)
            assert parser["Service"]["User"] == "gpufleet" and "EnvironmentFile" in parser["Service"], name
            assert "CAP_SYS_ADMIN" not in " ".join(parser["Service"].values()), f"{name} holds CAP_SYS_ADMIN"


def test_the_gpu_reset_helper_alone_holds_cap_sys_admin_and_no_network(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: scripts/install-test-deps.sh installs Debian's systemd")
    gpufleet = Path(sys.executable).with_name("gpufleet")
    units = tmp_path / "units"
    (units / "gpufleet-collector.service.d").mkdir(parents=True)
    for name in ("gpufleet-collector.service", "gpufleet-gpu-reset.service"):
        (units / name).write_text(
            (SYSTEMD / name).read_text().replace("/opt/gpufleet/venv/bin/gpufleet", str(gpufleet))
        )
    drop_in = SYSTEMD / "gpufleet-collector.service.d" / "gpu-reset.conf"
    (units / "gpufleet-collector.service.d" / drop_in.name).write_text(drop_in.read_text())
    # verify reads drop-ins from the unit path: the directory is put on it, and a drop-in with
    # a typo is reported (so the real one is read, not skipped).
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"}
    out = _verify(units / "gpufleet-collector.service", env)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    typo = units / "gpufleet-collector.service.d" / "typo.conf"
    typo.write_text("[Service]\nAmbientCapability=CAP_SYS_ADMIN\n")
    out = _verify(units / "gpufleet-collector.service", env)
    assert "Unknown key" in out.stderr, out.stderr
    typo.unlink()
    drop = configparser.ConfigParser(strict=False, interpolation=None)
    drop.read_string(drop_in.read_text())
    # The drop-in gives the collector no privilege: only the helper's socket.
    granted = " ".join(drop["Service"].values())
    assert "CAP_SYS_ADMIN" not in granted and "User" not in drop["Service"], granted
    assert drop["Unit"]["Wants"] == "gpufleet-gpu-reset.service"
    helper = configparser.ConfigParser(strict=False, interpolation=None)
    helper.read_string((SYSTEMD / "gpufleet-gpu-reset.service").read_text())
    service = helper["Service"]
    assert service["CapabilityBoundingSet"] == "CAP_SYS_ADMIN" == service["AmbientCapabilities"]
    assert service["PrivateNetwork"] == "yes" and service["RestrictAddressFamilies"] == "AF_UNIX"
    assert service["Group"] == "gpufleet", "the socket is the collector's group's to open"
    socket_dir = f"/run/{service['RuntimeDirectory']}/"
    assert socket_dir in service["ExecStart"] and "--gpu-reset -i {gpu_index}" in service["ExecStart"]
    assert f"GPUFLEET_COLLECTOR_RESET_SOCKET={socket_dir}gpu-reset.sock" in drop["Service"]["Environment"]


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The two RFC 6902 operations the component uses (kustomize applies them for real)."""
    for op in ops:
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "add" and last == "-":
            target.append(op["value"])
        elif op["op"] in ("add", "replace"):
            target[int(last) if isinstance(target, list) else last] = op["value"]
        else:
            raise AssertionError(f"unsupported op {op['op']}")
    return doc


def test_the_gpu_reset_component_adds_a_helper_and_leaves_the_collector_unprivileged() -> None:
    import kubernetes_validate

    component = yaml.safe_load((K8S / "components" / "gpu-reset" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (patch,) = component["patches"]
    daemonset = by_kind("DaemonSet", "gpufleet-collector")
    assert patch["target"] == {"kind": "DaemonSet", "name": "gpufleet-collector"}
    patched = _json_patch(daemonset, yaml.safe_load(patch["patch"]))
    kubernetes_validate.validate(patched, "1.33.0", strict=True)
    collector, helper = patched["spec"]["template"]["spec"]["containers"]
    # The network-facing collector keeps what telemetry needs and nothing more.
    assert collector["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert "ports" not in helper, "the helper listens on nothing but its Unix socket"
    assert helper["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    env = {e["name"]: e.get("value") for e in collector["env"]}
    socket_path = env["GPUFLEET_COLLECTOR_RESET_SOCKET"]
    assert "GPUFLEET_COLLECTOR_RESET_COMMAND" not in env
    assert helper["args"][:3] == ["gpu-reset-helper", "--socket", socket_path]
    assert helper["args"][3:] == ["--reset-command", "nvidia-smi --gpu-reset -i {gpu_index}"]
    shared = {m["name"]: m["mountPath"] for m in helper["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in collector["volumeMounts"]}["gpu-reset"] == shared["gpu-reset"]
    assert socket_path.startswith(shared["gpu-reset"] + "/")
    assert {e["name"]: e["value"] for e in helper["env"]}["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_the_dcgm_exporter_component_serves_dcgm_names_where_dcgm_exporter_was_scraped() -> None:
    """components/dcgm-exporter-compat: the collector on dcgm-exporter's port with the DCGM face
    beside its own names, and a Service with dcgm-exporter's labels and port name selecting the
    collector's pods, so a ServiceMonitor written for dcgm-exporter scrapes it (issue 56)."""
    import kubernetes_validate

    from gpufleet.collector.config import CollectorConfig

    where = K8S / "components" / "dcgm-exporter-compat"
    component = yaml.safe_load((where / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["service.yaml"]
    (patch,) = component["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "gpufleet-collector"}
    patched = _json_patch(by_kind("DaemonSet", "gpufleet-collector"), yaml.safe_load(patch["patch"]))
    kubernetes_validate.validate(patched, "1.33.0", strict=True)
    pod = patched["spec"]["template"]
    (collector, *_) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in collector["env"]}
    names = env["GPUFLEET_COLLECTOR_METRICS_NAMES"]
    assert names in ("dcgm", "both") and CollectorConfig(metrics_names=names).metrics_names == names
    assert env["GPUFLEET_COLLECTOR_METRICS_LISTEN"] == "0.0.0.0:9400"
    (port,) = collector["ports"]
    assert port == {"name": "metrics", "containerPort": 9400}
    service = by_kind("Service", "dcgm-exporter")
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "dcgm-exporter"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    out = subprocess.run([str(hadolint), str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gpufleet"]' in text and "USER 10001" in text


def unit(name: str) -> tuple[list[str], dict[str, str]]:
    """The unit's ExecStart arguments after the gpufleet binary, and its EnvironmentFile."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    argv = shlex.split(parser["Service"]["ExecStart"])[1:]
    env_file = SYSTEMD / Path(parser["Service"]["EnvironmentFile"]).name
    env = {}
    for line in env_file.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return argv, env


def config_file(argv: list[str], tmp: Path, text: str) -> list[str]:
    """The same arguments, with --config pointing at a copy of the file it names."""
    copy = tmp / f"gpufleet-{len(list(tmp.glob('gpufleet-*.toml')))}.toml"
    copy.write_text(text)
    return [str(copy) if a == "/etc/gpufleet/gpufleet.toml" else a for a in argv]


TLS_MOUNT = "/etc/gpufleet/tls/"  # where the manifests and units keep certificates


def tls_mount(tmp: Path) -> Path:
    """What the deploy files expect at TLS_MOUNT, made by a throwaway CA: the aggregator's
    certificate (for 127.0.0.1 here, and the name the replicas check) under both names the files
    use (cert-manager's tls.crt/tls.key on Kubernetes, aggregator.crt/.key on bare metal)."""
    pki = Pki(tmp / "pki")
    key, cert = pki.issue("aggregator", "IP:127.0.0.1,DNS:localhost,DNS:gpufleet-aggregator.gpufleet.svc")
    mount = tmp / "tls"
    mount.mkdir(exist_ok=True)
    for src, names in (
        (cert, ("tls.crt", "aggregator.crt")),
        (key, ("tls.key", "aggregator.key")),
        (pki.ca, ("ca.crt",)),
    ):
        for name in names:
            shutil.copy(src, mount / name)
    return mount


def mounted(values: dict[str, str], mount: Path) -> dict[str, str]:
    """Paths under TLS_MOUNT in these settings, as the volume mount puts them."""
    return {k: v.replace(TLS_MOUNT, f"{mount}/") for k, v in values.items()}


class FleetAt:
    """The Fleet API of an aggregator started from the deploy files (TLS, as they configure it)."""

    def __init__(self, address: str, tls: Path) -> None:
        self.address = address
        self.ca = (tls / "ca.crt").read_bytes()

    def fleet_stub(self) -> fleet_pb2_grpc.FleetStub:
        return fleet_pb2_grpc.FleetStub(
            grpc.secure_channel(self.address, grpc.ssl_channel_credentials(self.ca))
        )


def reported(agg: Any, cluster: Cluster, node: str) -> bool:
    meta = cluster.secrets.metadata()
    nodes = agg.fleet_stub().ListNodes(fleet_pb2.ListNodesRequest(), metadata=meta).nodes
    return any(n.node == node and n.last_seq >= 2 for n in nodes)


def start(cluster: Cluster, name: str, argv: list[str], env: dict[str, str]) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return cluster.spawn(name, [sys.executable, "-m", "gpufleet.cli.main", *argv], env={**clean, **env})


@pytest.mark.slow
def test_systemd_units_start_the_components_as_written(cluster: Cluster) -> None:
    ingest, fleet = free_port(), free_port()
    agg_argv, agg_env = unit("gpufleet-aggregator.service")
    # What differs from a real host, and only that: paths and loopback ports.
    agg_env.update(
        {
            "GPUFLEET_AGGREGATOR_DATA_DIR": str(cluster.tmp / "data"),
            "GPUFLEET_AGGREGATOR_SECRETS_FILE": str(cluster.secrets_path),
            "GPUFLEET_AGGREGATOR_INGEST_LISTEN": f"127.0.0.1:{ingest}",
            "GPUFLEET_AGGREGATOR_FLEET_LISTEN": f"127.0.0.1:{fleet}",
            "GPUFLEET_AGGREGATOR_METRICS_LISTEN": "127.0.0.1:0",
            "GPUFLEET_AGGREGATOR_REPAIR_BACKEND": "none",  # no slurmctld is needed to see reports flow
        }
    )
    assert set(agg_env) >= {"GPUFLEET_AGGREGATOR_DATA_DIR", "GPUFLEET_AGGREGATOR_SECRETS_FILE"}
    toml = (SYSTEMD / "gpufleet.toml").read_text()
    tls = tls_mount(cluster.tmp)
    assert agg_env["GPUFLEET_AGGREGATOR_TLS_CERT"].startswith(TLS_MOUNT)
    start(cluster, "aggregator", config_file(agg_argv, cluster.tmp, toml), mounted(agg_env, tls))
    col_argv, col_env = unit("gpufleet-collector.service")
    token = cluster.tmp / "collector.token"
    token.write_text(cluster.secrets.collector_token("slurm-gpu-01"))
    col_env.update(
        {
            "GPUFLEET_COLLECTOR_AGGREGATOR": f"127.0.0.1:{ingest}",
            "GPUFLEET_COLLECTOR_TOKEN_FILE": str(token),
            "GPUFLEET_COLLECTOR_STATE_DIR": str(cluster.tmp / "collector-state"),
            "GPUFLEET_COLLECTOR_METRICS_LISTEN": "127.0.0.1:0",
            "GPUFLEET_COLLECTOR_NODE": "slurm-gpu-01",
            "GPUFLEET_COLLECTOR_INTERVAL_S": "0.5",
            "GPUFLEET_COLLECTOR_KMSG_PATH": "",  # this host's kernel log has no GPU
            "GPUFLEET_COLLECTOR_SIMULATE": "true",  # no GPU here
        }
    )
    assert col_env["GPUFLEET_COLLECTOR_TLS_CA"].startswith(TLS_MOUNT)
    start(cluster, "collector", config_file(col_argv, cluster.tmp, toml), mounted(col_env, tls))
    agg = FleetAt(f"127.0.0.1:{fleet}", tls)
    wait_until(lambda: reported(agg, cluster, "slurm-gpu-01"), 60, "reports from the unit-started collector")


def container_env(container: dict[str, Any], values: dict[str, str]) -> dict[str, str]:
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item["name"] in values:
            env[item["name"]] = values[item["name"]]  # valueFrom: what the cluster would inject
    return env


@pytest.mark.slow
def test_kubernetes_manifests_start_the_components_as_written(cluster: Cluster) -> None:
    kube = KubeStandin()
    kube.add_node("k8s-gpu-node-1")
    kube.add_pod("gpufleet", "gpufleet-collector-x7k2p", "k8s-gpu-node-1", owner_kind="DaemonSet")
    ingest, fleet = free_port(), free_port()
    tls = tls_mount(cluster.tmp)
    toml = by_kind("ConfigMap", "gpufleet-config")["data"]["gpufleet.toml"]
    assert f'tls_cert = "{TLS_MOUNT}tls.crt"' in toml and f'tls_ca = "{TLS_MOUNT}ca.crt"' in toml
    toml = toml.replace(TLS_MOUNT, f"{tls}/")  # the Secret gpufleet-tls, mounted
    agg_container = by_kind("StatefulSet", "gpufleet-aggregator")["spec"]["template"]["spec"]["containers"][0]
    agg_env = container_env(agg_container, {})
    agg_env.update(
        {
            "GPUFLEET_AGGREGATOR_DATA_DIR": str(cluster.tmp / "data"),
            "GPUFLEET_AGGREGATOR_SECRETS_FILE": str(cluster.secrets_path),
            "GPUFLEET_AGGREGATOR_INGEST_LISTEN": f"127.0.0.1:{ingest}",
            "GPUFLEET_AGGREGATOR_FLEET_LISTEN": f"127.0.0.1:{fleet}",
            "GPUFLEET_AGGREGATOR_METRICS_LISTEN": "127.0.0.1:0",
            # The service account's in-cluster credentials, replaced by the API stand-in's.
            "GPUFLEET_AGGREGATOR_REPAIR_KUBECONFIG": str(kube.kubeconfig(cluster.tmp / "kubeconfig")),
            "GPUFLEET_AGGREGATOR_COLLECTOR_K8S_KUBECONFIG": str(cluster.tmp / "kubeconfig"),
            "GPUFLEET_AGGREGATOR_WORKLOAD_KUBECONFIG": str(cluster.tmp / "kubeconfig"),
        }
    )
    start(cluster, "aggregator", config_file(agg_container["args"], cluster.tmp, toml), agg_env)
    pod_spec = by_kind("DaemonSet", "gpufleet-collector")["spec"]["template"]["spec"]
    col_container = pod_spec["containers"][0]
    # The projected ServiceAccount token the kubelet would mount, issued by the stand-in.
    (projected,) = [v["projected"] for v in pod_spec["volumes"] if "projected" in v]
    audience = projected["sources"][0]["serviceAccountToken"]["audience"]
    token = cluster.tmp / "token"
    token.write_text(
        kube.issue_token("gpufleet", pod_spec["serviceAccountName"], "gpufleet-collector-x7k2p", [audience])
    )
    col_env = container_env(col_container, {"GPUFLEET_COLLECTOR_NODE": "k8s-gpu-node-1"})
    assert col_env["GPUFLEET_COLLECTOR_TOKEN_FILE"] == "/var/run/secrets/gpufleet/token"
    assert "GPUFLEET_COLLECTOR_SECRET_FILE" not in col_env, "no fleet-wide secret on GPU nodes"
    col_env.update(
        {
            "GPUFLEET_COLLECTOR_TOKEN_FILE": str(token),  # the projected token, here a file
            "GPUFLEET_COLLECTOR_STATE_DIR": str(cluster.tmp / "collector-state"),
            "GPUFLEET_COLLECTOR_AGGREGATOR": f"127.0.0.1:{ingest}",  # the Service's address, here loopback
            "GPUFLEET_COLLECTOR_METRICS_LISTEN": "127.0.0.1:0",
            "GPUFLEET_COLLECTOR_INTERVAL_S": "0.5",
            "GPUFLEET_COLLECTOR_KMSG_PATH": "",
            "GPUFLEET_COLLECTOR_SIMULATE": "true",
        }
    )
    start(cluster, "collector", config_file(col_container["args"], cluster.tmp, toml), col_env)
    agg = FleetAt(f"127.0.0.1:{fleet}", tls)
    wait_until(
        lambda: reported(agg, cluster, "k8s-gpu-node-1"), 60, "reports from the manifest-started collector"
    )
    # The repair backend, configured as the manifests say, reads the (stand-in) API server.
    wait_until(
        lambda: any(r["path"] == "/api/v1/nodes" for r in kube.requests), 30, "the backend's node LIST"
    )
    # The collector was let in by its pod's token: reviewed, and its pod read, as RBAC allows.
    assert ("authentication.k8s.io", "tokenreviews", "create") in kube.calls()
    assert kube.calls() <= API_CALLS | K8S_AUTH_CALLS, kube.calls() - (API_CALLS | K8S_AUTH_CALLS)
    kube.close()


def replicas_component() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the component's kustomization, its Deployment, its PodDisruptionBudget)."""
    comp = yaml.safe_load((K8S / "components" / "replicas" / "kustomization.yaml").read_text())
    found = {d["kind"]: d for d in docs(K8S / "components" / "replicas" / "aggregator-replicas.yaml")}
    return comp, found["Deployment"], found["PodDisruptionBudget"]


def test_the_replicas_component_swaps_the_statefulset_for_a_disruption_safe_deployment() -> None:
    comp, deployment, pdb = replicas_component()
    assert comp["kind"] == "Component" and comp["resources"] == ["aggregator-replicas.yaml"]
    (patch,) = comp["patches"]
    assert patch["target"] == {"kind": "StatefulSet", "name": "gpufleet-aggregator"}
    assert yaml.safe_load(patch["patch"])["$patch"] == "delete"
    spec = deployment["spec"]
    assert spec["replicas"] >= 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pdb["spec"]["selector"] == spec["selector"] and 1 <= pdb["spec"]["minAvailable"] < spec["replicas"]
    # The same container as the one-replica StatefulSet but for what makes it a replica.
    base = by_kind("StatefulSet", "gpufleet-aggregator")["spec"]["template"]["spec"]["containers"][0]
    (container,) = spec["template"]["spec"]["containers"]
    for key in ("image", "args", "ports", "resources", "startupProbe", "livenessProbe", "readinessProbe"):
        assert container[key] == base[key], key
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUFLEET_AGGREGATOR_CONTROL_PLANE"]["valueFrom"]["secretKeyRef"] == {
        "name": "gpufleet-postgresql",
        "key": "url",
    }
    assert env["GPUFLEET_AGGREGATOR_STORE"]["value"] == "influxdb"
    pg = {d["kind"]: d for d in docs(K8S / "components" / "postgresql" / "postgresql.yaml")}
    assert pg["Service"]["metadata"]["name"] == "gpufleet-postgresql"
    pg_env = {e["name"]: e for e in pg["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "gpufleet-postgresql"


def expand(env: dict[str, str]) -> dict[str, str]:
    """Kubernetes' $(VAR) references in env values, as the kubelet expands them."""
    import re

    return {k: re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), v) for k, v in env.items()}


@pytest.mark.slow
def test_the_replicas_component_starts_replicas_that_elect_one_leader(
    cluster: Cluster, pg_url: str, influxd: str
) -> None:
    kube = KubeStandin()
    tls = tls_mount(cluster.tmp)
    toml = by_kind("ConfigMap", "gpufleet-config")["data"]["gpufleet.toml"].replace(TLS_MOUNT, f"{tls}/")
    _, deployment, _ = replicas_component()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    fleets = []
    for i in range(2):
        pod = f"gpufleet-aggregator-5d9c-{i}"
        ingest, fleet = free_port(), free_port()
        env = expand(
            container_env(
                container,
                {"POD_NAME": pod, "POD_IP": "127.0.0.1", "GPUFLEET_AGGREGATOR_CONTROL_PLANE": pg_url},
            )
        )
        assert env["GPUFLEET_AGGREGATOR_REPLICA_ID"] == pod
        assert env["GPUFLEET_AGGREGATOR_REPLICA_ADVERTISE"] == "127.0.0.1:7711"
        env.update(
            {
                "GPUFLEET_AGGREGATOR_DATA_DIR": str(cluster.tmp / pod),
                "GPUFLEET_AGGREGATOR_SECRETS_FILE": str(cluster.secrets_path),
                "GPUFLEET_AGGREGATOR_INGEST_LISTEN": f"127.0.0.1:{ingest}",
                "GPUFLEET_AGGREGATOR_FLEET_LISTEN": f"127.0.0.1:{fleet}",
                "GPUFLEET_AGGREGATOR_METRICS_LISTEN": "127.0.0.1:0",
                "GPUFLEET_AGGREGATOR_REPLICA_ADVERTISE": f"127.0.0.1:{fleet}",  # one host: its own port
                "GPUFLEET_AGGREGATOR_INFLUX_URL": influxd,  # the in-cluster Service, here loopback
                "GPUFLEET_AGGREGATOR_REPAIR_KUBECONFIG": str(kube.kubeconfig(cluster.tmp / "kubeconfig")),
                "GPUFLEET_AGGREGATOR_COLLECTOR_K8S_KUBECONFIG": str(cluster.tmp / "kubeconfig"),
                "GPUFLEET_AGGREGATOR_WORKLOAD_KUBECONFIG": str(cluster.tmp / "kubeconfig"),
            }
        )
        start(cluster, pod, config_file(container["args"], cluster.tmp, toml), env)
        fleets.append(FleetAt(f"127.0.0.1:{fleet}", tls))
    meta = cluster.secrets.metadata()

    def statuses() -> list[Any] | None:
        got = [f.fleet_stub().GetStatus(fleet_pb2.StatusRequest(), metadata=meta, timeout=5) for f in fleets]
        return (
            got if all(len(s.replicas) == 2 for s in got) and sum(s.repair_leader for s in got) == 1 else None
        )

    got = wait_until(statuses, 60, "two replicas, one repair leader")
    assert {s.leader for s in got} == {next(s.replica_id for s in got if s.repair_leader)}
    assert all(s.healthy for s in got), [list(s.unhealthy_reasons) for s in got]
    kube.close()
