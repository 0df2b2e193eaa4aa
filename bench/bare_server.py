"""The baseline: a bare gRPC Ingest stream server that decodes each message and acks it at
once — no authentication, validation, storage or fleet view. What the aggregator adds on
top of gRPC itself is the difference between the two in bench/ingest_bench.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from gpufleet.protos import ingest_pb2


async def stream(
    requests: AsyncIterator[ingest_pb2.CollectorMessage], context: grpc.aio.ServicerContext
) -> AsyncIterator[ingest_pb2.AggregatorMessage]:
    async for msg in requests:
        body = msg.WhichOneof("body")
        if body == "hello":
            yield ingest_pb2.AggregatorMessage(welcome=ingest_pb2.Welcome(protocol_version=1))
        elif body == "report":
            yield ingest_pb2.AggregatorMessage(ack=ingest_pb2.Ack(seqs=[msg.report.seq]))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--ready-file", required=True)
    args = p.parse_args()
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        stream,
        request_deserializer=ingest_pb2.CollectorMessage.FromString,
        response_serializer=ingest_pb2.AggregatorMessage.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gpufleet.v1.Ingest", {"Stream": handler}),)
    )
    port = server.add_insecure_port(args.listen)
    await server.start()
    Path(args.ready_file).write_text(json.dumps({"pid": os.getpid(), "ingest": f"127.0.0.1:{port}"}))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
