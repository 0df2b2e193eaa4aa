"""Which GPU each Kubernetes pod was allocated, from the kubelet's PodResources API (its `List`
over the node's unix socket, /var/lib/kubelet/pod-resources/kubelet.sock; dcgm-exporter's
method): an allocation is seen even with no process on the GPU. Device ids are the NVIDIA
device plugin's: GPU UUIDs (or, with some plug-in settings, indices), mapped to this node's NVML
indices; a device id that is neither is skipped and counted. The pod is named `namespace/name`;
the aggregator checks with the API server that the pod runs on this node and holds that many
GPUs (docs/workloads.md "Kubernetes")."""

from __future__ import annotations

import logging

import grpc

from gpufleet.protos import podresources_pb2, podresources_pb2_grpc, telemetry_pb2
from gpufleet.protos.limits import MAX_WORKLOADS_PER_REPORT
from gpufleet.protos.names import workload_problem

log = logging.getLogger("gpufleet.collector.workloads")

MAX_ANSWER_BYTES = 4 << 20  # a kubelet's answer for one node's pods is far smaller


class PodResourcesReader:
    def __init__(self, socket_path: str, resource_names: tuple[str, ...], timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.resource_names = resource_names
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        )
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)
        self.failed_total = 0
        self.unknown_devices_total = 0

    def close(self) -> None:
        self._channel.close()

    def read(self, inventory: list[telemetry_pb2.GpuIdentity]) -> list[telemetry_pb2.WorkloadSample]:
        """The pods holding this node's GPUs; [] (counted, logged at the first failure of a run of
        them) when the kubelet does not answer."""
        try:
            answer = self._stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self.failed_total += 1
            if self.failed_total == 1 or self.failed_total % 100 == 0:
                log.warning(
                    "the kubelet's PodResources API at %s did not answer (%s; %d times): pods' GPUs not "
                    "reported until it does",
                    self.socket_path,
                    exc.code() if hasattr(exc, "code") else exc,
                    self.failed_total,
                )
            return []
        by_uuid = {g.uuid: g.index for g in inventory}
        indices = {g.index for g in inventory}
        out: list[telemetry_pb2.WorkloadSample] = []
        for pod in answer.pod_resources:
            for container in pod.containers:
                gpus: set[int] = set()
                for device in container.devices:
                    if device.resource_name not in self.resource_names:
                        continue
                    for device_id in device.device_ids:
                        index = by_uuid.get(device_id)
                        if index is None and device_id.isdigit() and int(device_id) in indices:
                            index = int(device_id)
                        if index is None:
                            self.unknown_devices_total += 1
                            continue
                        gpus.add(index)
                pod_id = f"{pod.namespace}/{pod.name}"
                if not gpus or workload_problem("kubernetes", pod_id, container.name):
                    continue
                if len(out) >= MAX_WORKLOADS_PER_REPORT - 1:
                    return out
                out.append(
                    telemetry_pb2.WorkloadSample(
                        scheduler="kubernetes",
                        id=pod_id,
                        part=container.name,
                        gpu_indices=sorted(gpus),
                        source="podresources",
                    )
                )
        return out
