"""The health policy: `gpufleet policy explain` against NVIDIA's XID catalog, policy files
checked with precise errors, local overrides kept separate from the shipped defaults."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from gpufleet.repair.policy import PolicyError, load_policy
from harness.paths import TEST_DATA
from harness.processes import gpufleet_argv

CATALOG = TEST_DATA / "xid_catalog.csv"
# Buckets whose errors are the application's or need no action: these never cordon a node.
NO_CORDON = {"RESTART_APP", "IGNORE", "XID_154_EVAL", "WORKFLOW_XID_45", "CHECK_UVM"}


def catalog_rows() -> list[tuple[int, str, str]]:
    """tests/data/xid_catalog.csv: NVIDIA XID catalog (Ampere+), R580 drivers, read
    2026-11-29 from docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (header of
    the file gives the cross-check source)."""
    lines = [line for line in CATALOG.read_text().splitlines() if line and not line.startswith("#")]
    return [(int(x), m, b) for x, m, b in csv.reader(lines)]


def test_policy_explain_agrees_with_nvidias_catalog_for_every_xid() -> None:
    rows = catalog_rows()
    assert len(rows) == 162 and [r[0] for r in rows] == list(range(1, 163))
    # One process for all: `policy explain` is the function below with JSON printing.
    policy = load_policy()
    for xid, _mnemonic, bucket in rows:
        explained = policy.explain_xid(xid)
        assert explained["action"] == bucket, f"XID {xid}: {explained['action']} != catalog {bucket}"
        assert explained["cordon"] is (bucket not in NO_CORDON), f"XID {xid} ({bucket})"
    # And through the CLI, for a sample, with the documented JSON keys.
    for xid in (13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119, 144, 154):
        out = subprocess.run(
            gpufleet_argv("policy", "explain", "--xid", str(xid), "--json"),
            capture_output=True,
            text=True,
            check=True,
        )
        explained = json.loads(out.stdout)
        assert {"xid", "severity", "action", "cordon", "reason"} <= set(explained)
        assert explained["xid"] == xid and explained["action"] == dict((r[0], r[2]) for r in rows)[xid]


def test_application_xids_do_not_cordon_and_hardware_ones_do() -> None:
    policy = load_policy()
    for xid in (13, 31, 43, 45, 94):
        assert policy.explain_xid(xid)["cordon"] is False, xid
        assert policy.explain_xid(xid)["severity"] == "info", xid
    for xid in (48, 62, 64, 74, 79, 95, 119, 120, 140):
        assert policy.explain_xid(xid)["cordon"] is True, xid


def test_multi_xid_workflow_48_with_63_or_64() -> None:
    out = subprocess.run(
        gpufleet_argv("policy", "explain", "--xid", "48", "--with-xid", "63", "--json"),
        capture_output=True,
        text=True,
        check=True,
    )
    explained = json.loads(out.stdout)
    assert explained["action"] == "DRAIN_AND_RESET" and explained["cordon"] is True
    assert load_policy().explain_xid(48)["action"] == "WORKFLOW_XID_48"
    assert load_policy().explain_xid(48, {64})["action"] == "DRAIN_AND_RESET"


def test_an_xid_newer_than_the_catalog_goes_to_a_person() -> None:
    explained = load_policy().explain_xid(999)
    assert explained["action"] == "CONTACT_SUPPORT" and explained["cordon"] is True
    assert "not in" in explained["reason"]


def test_local_overrides_change_only_what_they_name(tmp_path: Path) -> None:
    override = tmp_path / "site.toml"
    override.write_text('[xid.13]\nseverity = "warning"\n\n[rules.thermal_slowdown]\nwindow_s = 120\n')
    out = subprocess.run(gpufleet_argv("policy", "check", str(override)), capture_output=True, text=True)
    assert out.returncode == 0 and "valid" in out.stdout
    policy = load_policy(override)
    assert policy.explain_xid(13)["severity"] == "warning" and policy.explain_xid(13)["cordon"] is False
    assert policy.explain_xid(13)["decided_by"] == "local override [xid.13]"
    assert policy.rules["thermal_slowdown"].window_s == 120
    assert policy.rules["thermal_slowdown"].severity == "warning", "the rest comes from the defaults"
    assert load_policy().rules["thermal_slowdown"].window_s == 300, "the shipped defaults are untouched"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[rules.thermal_slowdown]\nwindow_s = -1\n",
            "[rules.thermal_slowdown]: window_s = -1 must be a number ≥ 0",
        ),
        ('[rules.nope]\nseverity = "info"\n', "[rules.nope] is not a rule"),
        (
            '[xid.79]\nseverity = "fatal"\n',
            "[xid.79]: severity = 'fatal'; use one of info, warning, critical",
        ),
        ('[xid.79]\naction = "REBOOT"\n', "action = 'REBOOT'; use one of"),
        ("[xid.abc]\ncordon = false\n", "[xid.abc]: XID must be a number from 1 to 999"),
        (
            '[buckets.RESET_GPU]\nladder = ["pray"]\n',
            "ladder = ['pray']; steps are reset_gpu, reboot, ticket",
        ),
        ('[rules.gpu_lost]\ncordon = "yes"\n', "cordon = 'yes' must be true or false"),
        ("[workflow]\nvalidate_seconds = 3\n", "[workflow] unknown key 'validate_seconds'"),
        ("[bucket.RESET_GPU]\n", "unknown table(s) bucket"),
        ("[rules.gpu_lost\n", "is not valid TOML"),
    ],
)
def test_policy_check_names_the_key_and_value(tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_policy(bad)
    assert message in str(err.value) and str(bad) in str(err.value)
    out = subprocess.run(gpufleet_argv("policy", "check", str(bad)), capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr
