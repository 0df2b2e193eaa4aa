"""The collector's DCGM face (collector/dcgm_face.py) rendered from reports: dcgm-exporter's names,
units and labels, the pod of a Kubernetes workload on its GPU, whatever the node says of its
workloads (hostile names included: each label value comes back as written, never another
label). Served by a real collector and queried through a real Prometheus in
tests/project/test_prometheus_grafana.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.dcgm_face import LABELS, served_names
from gpufleet.collector.metrics_endpoint import registry_of
from gpufleet.protos import telemetry_pb2

GIB = 1 << 30


def report(workloads: list[telemetry_pb2.WorkloadSample] = ()) -> telemetry_pb2.NodeReport:
    gpus = [
        telemetry_pb2.GpuSample(
            index=i,
            uuid=f"GPU-{i}",
            model="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            util_gpu_pct=40.0 + i,
            hbm_used_bytes=10 * GIB,
            hbm_total_bytes=80 * GIB,
            temp_gpu_c=50.0,
            sm_active_pct=30.0,
        )
        for i in range(2)
    ]
    return telemetry_pb2.NodeReport(node="n1", cluster="c", gpus=gpus, workloads=list(workloads))


def families(registry: CollectorRegistry) -> dict[str, list]:
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def dcgm(r: telemetry_pb2.NodeReport, xid_last: dict[str, int] | None = None) -> dict[str, list]:
    return families(
        registry_of("dcgm", lambda: r, xid_last=lambda: xid_last or {}, driver_version=lambda: "570.133.20")
    )


def test_dcgm_names_units_and_labels() -> None:
    got = dcgm(report(), {"1": 79})
    assert set(got) == set(served_names()) and not any(n.startswith("gpufleet_") for n in got)
    used = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_FB_USED"]}
    assert used == {"0": 10 * 1024, "1": 10 * 1024}  # MiB
    free = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_FB_FREE"]}
    assert free == {"0": 70 * 1024, "1": 70 * 1024}
    assert [s.value for s in got["DCGM_FI_PROF_SM_ACTIVE"]] == [0.3, 0.3]  # a 0-1 ratio
    assert [s.value for s in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] == [0.4, 0.41]
    assert [s.value for s in got["DCGM_FI_DEV_XID_ERRORS"]] == [0.0, 79.0]
    sample = got["DCGM_FI_DEV_GPU_UTIL"][0]
    assert sample.labels == {
        "gpu": "0",
        "UUID": "GPU-0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "n1",
        "pci_bus_id": "00000000:18:00.0",
        "DCGM_FI_DRIVER_VERSION": "570.133.20",
        "pod": "",
        "namespace": "",
        "container": "",
    }
    assert "DCGM_FI_DEV_POWER_USAGE" in got and got["DCGM_FI_DEV_POWER_USAGE"] == []  # not reported: absent


def test_a_pods_gpu_carries_its_pod_namespace_and_container() -> None:
    pod = telemetry_pb2.WorkloadSample(
        scheduler="kubernetes", id="ml/train-0", part="trainer", gpu_indices=[1]
    )
    job = telemetry_pb2.WorkloadSample(scheduler="slurm", id="42", part="batch", gpu_indices=[0])
    labels = {s.labels["gpu"]: s.labels for s in dcgm(report([pod, job]))["DCGM_FI_DEV_GPU_TEMP"]}
    assert (labels["1"]["pod"], labels["1"]["namespace"], labels["1"]["container"]) == (
        "train-0",
        "ml",
        "trainer",
    )
    assert (labels["0"]["pod"], labels["0"]["namespace"]) == ("", ""), "a Slurm job is no pod"


def test_both_faces_serve_both_names() -> None:
    r = report()
    got = families(registry_of("both", lambda: r))
    assert "DCGM_FI_DEV_GPU_UTIL" in got and "gpufleet_gpu_utilization_ratio" in got
    assert not any(n.startswith("DCGM_") for n in families(registry_of("gpufleet", lambda: r)))


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
# A namespace is a DNS label (the id is "namespace/pod"); the pod and container may say anything.
@given(namespace=text.filter(lambda t: "/" not in t), pod=text, container=text, model=text, node=text)
def test_whatever_a_node_names_comes_back_as_one_label_value(
    namespace: str, pod: str, container: str, model: str, node: str
) -> None:
    """A node's workload and model names are its word: rendered, each is one label value, read
    back as written (quotes, newlines, braces and all), never a label or a sample of its own."""
    r = report([telemetry_pb2.WorkloadSample(scheduler="kubernetes", id=f"{namespace}/{pod}",
                                             part=container, gpu_indices=[0])])  # fmt: skip
    r.node = node
    for g in r.gpus:
        g.model = model
    got = dcgm(r)
    (first, second) = got["DCGM_FI_DEV_GPU_TEMP"]
    assert set(first.labels) == set(LABELS)
    assert (first.labels["Hostname"], first.labels["modelName"]) == (node, model)
    if pod:
        assert (first.labels["namespace"], first.labels["pod"], first.labels["container"]) == (
            namespace, pod, container,
        )  # fmt: skip
    assert second.labels["pod"] == ""


def test_the_docs_list_the_fields_served() -> None:
    """docs/prometheus-and-grafana.md's table is the catalog's (scripts/gen_dcgm_doc.py writes it)."""
    from gpufleet.collector.dcgm_face import docs_table
    from harness.paths import REPO

    doc = (REPO / "docs" / "prometheus-and-grafana.md").read_text()
    assert docs_table() in doc, "run scripts/gen_dcgm_doc.py"
    for name in served_names():
        assert f"`{name}`" in docs_table()
