"""The `gpufleet` command's exit codes: one table, which the CLI returns from and the README
quotes (tests/project/test_cli_habits.py checks the README's sentence is this table's)."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # the aggregator answered with an error not below (its gRPC status is printed)
    USAGE = 2  # bad arguments or configuration: a flag, a settings or client.toml file, a token file
    UNREACHABLE = 3  # no aggregator answered at the address (or in time)
    CREDENTIAL = 4  # the credential was rejected, or its role may not do this
    NOT_FOUND = 5  # no such node, incident or token


MEANING = {
    Exit.OK: "ok",
    Exit.FAILED: "the aggregator answered with another error",
    Exit.USAGE: "bad arguments or configuration",
    Exit.UNREACHABLE: "aggregator unreachable",
    Exit.CREDENTIAL: "credential rejected",
    Exit.NOT_FOUND: "not found",
}


def sentence() -> str:
    """The exit codes as the README says them."""
    return "Exit codes: " + ", ".join(f"{int(code)} {MEANING[code]}" for code in Exit) + "."


class ClientError(Exception):
    """Something the user must fix; exit_code tells scripts which kind (the table above). Here,
    not in client/fleet.py, so the CLI can catch it without importing gRPC for a component."""

    def __init__(self, message: str, exit_code: int = Exit.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
