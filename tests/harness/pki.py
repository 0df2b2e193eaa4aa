"""A throwaway certificate authority for the TLS tests (openssl, Debian's package): a CA, an
aggregator certificate for loopback and client certificates named after nodes (mTLS)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass
class Pki:
    home: Path

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.ca_key, self.ca = self.home / "ca.key", self.home / "ca.crt"
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gpufleet test CA",
            "-keyout", str(self.ca_key), "-out", str(self.ca),
        )  # fmt: skip

    def issue(self, name: str, san: str) -> tuple[Path, Path]:
        """(key, certificate) for CN=name with these subjectAltNames, signed by the CA."""
        key, csr, cert = self.home / f"{name}.key", self.home / f"{name}.csr", self.home / f"{name}.crt"
        ext = self.home / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", str(key), "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                 "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
        return key, cert

    def server(self) -> tuple[Path, Path]:
        """The aggregator's certificate: good for 127.0.0.1 and localhost."""
        return self.issue("aggregator", "IP:127.0.0.1,DNS:localhost")

    def client(self, node: str) -> tuple[Path, Path]:
        """A collector's client certificate: CN and DNS name are the node."""
        return self.issue(node, f"DNS:{node}")
