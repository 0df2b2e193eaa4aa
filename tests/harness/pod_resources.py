"""A kubelet's PodResources API for the tests: the real gRPC service (protos/podresources.proto,
the upstream v1 messages) on a unix socket, answering `List` with the pods and devices a test
sets — the kubelet's view of which GPU each pod's container was allocated."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from gpufleet.protos import podresources_pb2, podresources_pb2_grpc


class PodResourcesStandin(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, path: Path) -> None:
        self.path = path
        # (namespace, pod, container, resource name, device ids)
        self.allocations: list[tuple[str, str, str, str, list[str]]] = []
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{path}")
        self._server.start()

    def List(self, request: object, context: object) -> podresources_pb2.ListPodResourcesResponse:
        self.calls += 1
        out = podresources_pb2.ListPodResourcesResponse()
        for namespace, pod, container, resource, devices in list(self.allocations):
            entry = out.pod_resources.add(name=pod, namespace=namespace)
            entry.containers.add(name=container).devices.add(resource_name=resource, device_ids=devices)
        return out

    def close(self) -> None:
        self._server.stop(0)
