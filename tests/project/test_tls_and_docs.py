"""TLS on both gRPC ports, and the README staying true to the code."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from gpufleet.aggregator.config import AggregatorConfig
from gpufleet.cli import settings
from gpufleet.collector.config import CollectorConfig
from harness.paths import REPO
from harness.processes import Cluster, gpufleet_argv
from harness.waiting import wait_until


def self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "tls.key", tmp / "tls.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


def test_collector_and_cli_over_tls(cluster: Cluster, tmp_path: Path) -> None:
    if not any((Path(d) / "openssl").exists() for d in os.environ.get("PATH", "").split(":")):
        pytest.skip("openssl is not installed")
    key, cert = self_signed(tmp_path)
    agg = cluster.aggregator("aggregator", 0, 0, None, "--tls-cert", str(cert), "--tls-key", str(key))
    ingest = agg.ingest.replace("0.0.0.0", "127.0.0.1")
    cluster.collector("tls-node", ingest, "--interval-s", "0.2", "--tls-ca", str(cert))
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_TLS_CA": str(cert),
        "GPUFLEET_CLIENT_CONFIG": str(tmp_path / "none.toml"),
    }

    def nodes() -> list[dict[str, object]]:
        r = subprocess.run(gpufleet_argv("nodes", "--json"), env=env, capture_output=True, text=True)
        listed = json.loads(r.stdout)["nodes"] if r.returncode == 0 else []
        return listed if listed and listed[0]["last_report"] else []

    got = wait_until(nodes, 30, "the node to report over TLS")
    assert got[0]["node"] == "tls-node" and got[0]["liveness"] == "reporting"
    plain = subprocess.run(
        gpufleet_argv("nodes"), capture_output=True, text=True, env={**env, "GPUFLEET_TLS_CA": ""}
    )
    assert plain.returncode == 3, "a plaintext client cannot talk to a TLS port"


def test_configuration_reference_matches_the_code() -> None:
    readme = (REPO / "docs" / "configuration.md").read_text()
    start = readme.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = readme.index("<!-- config-reference:end -->")
    current = settings.reference({"collector": CollectorConfig, "aggregator": AggregatorConfig})
    assert readme[start:end].strip() == current.strip(), (
        "docs/configuration.md is out of date: paste `gpufleet config reference` "
        "between the config-reference markers"
    )


def test_readme_commands_exist() -> None:
    readme = (REPO / "README.md").read_text()
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert f"./{script}" in readme and os.access(REPO / script, os.X_OK)
    # The README's whole-suite command is the one CI runs, word for word.
    (whole,) = [line.split("#")[0].split() for line in readme.splitlines() if "the whole test suite" in line]
    (ci,) = [
        line.split()[1:]
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.startswith("exec ")
    ]
    assert [whole[0].removeprefix("./"), *whole[1:]] == ci == ["scripts/test.sh"]


def test_every_relative_link_in_the_docs_leads_somewhere() -> None:
    """The README is short and sends a newcomer to docs/: every link it and the docs pages make
    to a file of the repository names one that exists."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert len(pages) >= 9
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            where = page.relative_to(REPO)
            assert (page.parent / target).exists(), f"{where} links to {target}, which is not there"
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200, "the README keeps what a newcomer needs first"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", readme))
    assert linked == {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}, "every docs page is linked"
