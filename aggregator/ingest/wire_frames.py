"""Frames on the socket between the aggregator's main process and its ingest workers: a
4-byte big-endian length, then that many bytes (one protobuf message of protos/worker.proto)."""

from __future__ import annotations

import asyncio
import struct

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # a batch of reports; far beyond any real one


def frame(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame, or None at a clean end of stream (the other process closed it)."""
    try:
        header = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError(f"frame header cut short after {len(exc.partial)} bytes") from None
        return None
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return await reader.readexactly(length)
