"""Kernel-log XID parsing on real line formats. Each line below is quoted from the public
source named beside it (NVIDIA's documentation, NVIDIA's and others' issue trackers)."""

from __future__ import annotations

import pytest

from gpufleet.collector.sources.kmsg_parse import (
    KernelLogParser,
    KernelXid,
    Unparsed,
    bus_key,
    kmsg_payload,
)


def parse(*lines: str) -> list[KernelXid | Unparsed]:
    parser = KernelLogParser()
    return [r for r in (parser.feed(line) for line in lines) if r is not None]


# (source, line, expected xid, bus, pid, process name, start of message)
CLASSIC = [
    (
        "github.com/NVIDIA/NVSentinel/issues/155 (comment)",
        "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
        79,
        "0000:44:00",
        0,
        "",
        "GPU has fallen off the bus",
    ),
    (
        "github.com/leptonai/gpud/pull/46 (dmesg --ctime output)",
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, "
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        109,
        "0000:cb:00",
        1797828,
        "pt_main_thread",
        "Ch 00000008, errorString CTX SWITCH TIMEOUT",
    ),
    (
        "github.com/leptonai/gpud/pull/46 (pid unknown)",
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
        "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        13,
        "0000:cb:00",
        0,
        "",
        "Graphics SM Warp Exception",
    ),
    (
        "huggingface.co/datasets/LHRS-UM-FERI/MENTHOS-dataset-rootcause",
        "NVRM: Xid (PCI:0000:0f:00): 64, pid=57530, Row Remapper Error: (0x00000005d28c03a0) - All reserved "
        "rows for bank are remapped",
        64,
        "0000:0f:00",
        57530,
        "",
        "Row Remapper Error",
    ),
    (
        "pastebin.com/gn6mYmM4 (2012: no PCI: prefix, syslog prefix)",
        "May 6 00:38:27 alex kernel: [ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d "
        "00000104 00000000 00000100",
        13,
        "0000:01:00",
        0,
        "",
        "0005 00000000",
    ),
    (
        "github.com/NVIDIA/open-gpu-kernel-modules/issues/1150 (journal, secondary Xid)",
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, "
        "Ch 00000001 caused by previous Xid 149",
        45,
        "0000:dc:00",
        1818990,
        "python3",
        "Ch 00000001 caused by previous Xid 149",
    ),
    (
        "github.com/leptonai/gpud/pull/1174 (kmsg input)",
        "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
        94,
        "0000:9b:00",
        1234,
        "python3",
        "Contained ECC error",
    ),
]


@pytest.mark.parametrize("source,line,xid,bus,pid,name,message", CLASSIC, ids=[c[0][:40] for c in CLASSIC])
def test_classic_and_older_xid_lines(
    source: str, line: str, xid: int, bus: str, pid: int, name: str, message: str
) -> None:
    (got,) = parse(line)
    assert isinstance(got, KernelXid), source
    assert (got.xid, got.bus_id, got.pid, got.process_name) == (xid, bus, pid, name)
    assert got.message.startswith(message)


def test_nvlink5_xids_carry_unit_severity_and_link() -> None:
    # github.com/leptonai/gpud/pull/1174 (kmsg inputs) and pull/1160
    nonfatal, fatal, netir = parse(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
        "0x00000001 0x00000000 0x00100000 0x00000004)",
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 "
        "0x00000000 0x00000000 0x00000000)",
    )
    assert (nonfatal.xid, nonfatal.nvlink_unit, nonfatal.nvlink_fatal, nonfatal.nvlink_link) == (
        145,
        "RLW_RXPIPE",
        False,
        13,
    )
    assert (fatal.xid, fatal.nvlink_unit, fatal.nvlink_fatal, fatal.nvlink_link) == (
        149,
        "NETIR_LINK_EVT",
        True,
        0,
    )
    assert netir.bus_id == "0019:01:00" and netir.nvlink_link == -1


def test_xid_154_names_the_recovery_action_now_required() -> None:
    # Wording per NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
    # "Xid 154 linkage"): the driver logs the change of the GPU's recovery action.
    (got,) = parse(
        "NVRM: Xid (PCI:0000:ca:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)"
    )
    assert got.xid == 154 and got.recovery_action == "GPU Reset Required"


def test_fallen_off_the_bus_without_an_xid_line_is_xid_79() -> None:
    # github.com/NVIDIA/NVSentinel/issues/155 and github.com/leptonai/gpud/pull/1209: newer drivers
    # print this over several lines, with no Xid.
    got = parse(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    )
    assert len(got) == 1 and got[0].xid == 79 and bus_key(got[0].bus_id) == (0, 0xB3, 0)


def test_kmsg_records_are_unwrapped() -> None:
    record = "4,1234,5678901234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    (got,) = parse(kmsg_payload(record))
    assert got.xid == 79 and got.bus_id == "0000:3b:00"
    assert kmsg_payload("plain line; with a semicolon") == "plain line; with a semicolon"


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:3b:00): ",  # truncated
        "NVRM: Xid (PCI:zzzz:3b:00): 79, text",  # not hex
        "NVRM: Xid (3b): 13, short bus id",
        "NVRM: fallen off the bus and is not responding to commands.",  # continuation with no GPU line
    ],
)
def test_odd_nvrm_xid_lines_are_reported_unparsed_not_raised(line: str) -> None:
    (got,) = parse(line)
    assert isinstance(got, Unparsed) and got.line == line


@pytest.mark.parametrize(
    "line",
    [
        "",
        "kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01",
        "\x00\xff garbage \u2603",
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed!",
    ],
)
def test_other_lines_are_ignored(line: str) -> None:
    assert parse(line) == []


def test_bus_ids_match_across_spellings() -> None:
    assert bus_key("0000:3b:00") == bus_key("00000000:3B:00.0") == bus_key("PCI:0000:3b:00") == (0, 0x3B, 0)
