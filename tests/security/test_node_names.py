"""No node name reaches a scheduler, a hook or a URL unless it is a name by the one grammar
(protos/credentials.py; docs/security.md "Node names"), property-based over any text.

Each generated name goes through what a collector's Hello meets (the ingest checks), and then,
as if a check before had let it through, through every place a name becomes part of a command
or a request: the Slurm backend's scontrol (the real one, on the session's slurmctld, behind a
wrapper that logs each argv), the hook backend and the reboot/ticket hooks (a command that
logs its argv), and the Kubernetes backend (its URLs, read off the API stand-in's request log).
A name outside the grammar is refused everywhere and appears in no log; a name inside it
reaches each as exactly one argument or path segment."""

from __future__ import annotations

import asyncio
import json
import shlex
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.ingest.validation import Checker, Rejection
from gpufleet.protos import ingest_pb2
from gpufleet.protos.credentials import NODE_NAME_RE, node_name_problem
from gpufleet.repair.backends.base import Backend, BackendError
from gpufleet.repair.backends.hook import HookBackend
from gpufleet.repair.backends.kubernetes import KubernetesBackend
from gpufleet.repair.backends.slurm import SlurmBackend
from gpufleet.repair.hooks import run_hook
from harness.k8s_standin import KubeStandin

GOOD = st.from_regex(NODE_NAME_RE, fullmatch=True).filter(lambda n: len(n) <= 60)
NAMES = st.one_of(
    GOOD,
    st.text(max_size=40),
    st.sampled_from(
        [
            "-oProxyCommand=touch /tmp/x",
            "gpu[001-128]",
            "gpu201,gpu202",
            "../x",
            "a b",
            "x=y",
            "a/b",
            ".a",
            "ALL",
            "all",
            "aLL",
        ]
    ),
    # A good name with one character of another kind put in it somewhere.
    st.tuples(GOOD, st.characters(exclude_characters="._-"), st.integers(0, 60)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]
    ),
)


@dataclass
class Places:
    """Each place a name can become an argv or a URL, with what it has logged so far."""

    backends: list[tuple[str, Backend, Callable[[], list[str]]]]
    hook: Path
    hook_log: Path
    loop: asyncio.AbstractEventLoop

    def hook_calls(self) -> list[str]:
        return [json.dumps(a) for a in _argvs(self.hook_log)]


END_OF_CALL = "\x1e"  # after each call's arguments (each ends with a NUL: argv cannot hold one)


def _argvs(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [call.split("\0")[:-1] for call in path.read_text().split(END_OF_CALL)[:-1]]


def _logger(path: Path, log: Path, then: str | None) -> Path:
    """An executable that appends its argv to log (each argument NUL-ended, each call ended by
    END_OF_CALL), then runs `then` with it (or exits 0). A shell script, not Python: it runs ~700
    times a run, and a Python start-up each was most of this module's CPU."""
    run = f'exec {shlex.quote(then)} "$@"' if then else "exit 0"
    path.write_text(
        "#!/bin/sh\n"
        f"{{ for a in \"$@\"; do printf '%s\\0' \"$a\"; done; printf '\\036'; }} >> {shlex.quote(str(log))}\n"
        f"{run}\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def places(slurm_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Places]:
    tmp = tmp_path_factory.mktemp("names")
    scontrol_log, hook_log = tmp / "scontrol.log", tmp / "hook.log"
    scontrol = _logger(tmp / "scontrol", scontrol_log, "scontrol")
    hook = _logger(tmp / "hook", hook_log, None)
    kube = KubeStandin()
    kube.add_node("gpu-node-01")
    template = f"{hook} --host {{node}} --reason {{reason}}"

    def k8s_paths() -> list[str]:
        return [urllib.parse.unquote(r["path"]) for r in kube.requests]

    def scontrol_calls() -> list[str]:
        return [json.dumps(a) for a in _argvs(scontrol_log)]

    def hook_calls() -> list[str]:
        return [json.dumps(a) for a in _argvs(hook_log)]

    backends: list[tuple[str, Backend, Callable[[], list[str]]]] = [
        ("slurm", SlurmBackend(str(scontrol), str(slurm_cluster.conf), 30), scontrol_calls),
        ("hook", HookBackend(template, template, template, 30), hook_calls),
        ("kubernetes", KubernetesBackend(str(kube.kubeconfig(tmp / "kubeconfig")), 10), k8s_paths),
    ]
    loop = asyncio.new_event_loop()
    try:
        yield Places(backends, hook, hook_log, loop)
    finally:
        loop.close()
        kube.close()


def _hello(name: str) -> ingest_pb2.Hello:
    return ingest_pb2.Hello(protocol_version=1, node=name, cluster="test", boot_id="b", interval_s=1.0)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same names every run: a red run is a finding, not luck
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@pytest.mark.slow
@given(name=NAMES)
def test_no_name_reaches_a_backend_unless_it_matches_the_grammar(places: Places, name: str) -> None:
    good = NODE_NAME_RE.fullmatch(name) is not None and name.lower() != "all"
    assert good == (node_name_problem(name) == "")
    try:
        Checker(1 << 20, 86400, 300).check_hello(_hello(name))
        accepted = True
    except Rejection as r:
        accepted = False
        assert r.reason == "bad_name" and "node name" in r.message, r.message
    assert accepted == good, f"the hello took {name!r}" if accepted else f"the hello refused {name!r}"
    for label, backend, calls in places.backends:
        before = len(calls())
        for act in (
            backend.cordon(name, "gpufleet: name test", automation=False),
            backend.drain(name),
            backend.uncordon(name, automation=False),
        ):
            try:
                places.loop.run_until_complete(act)
            except BackendError as exc:
                if not good:
                    assert "refusing node name" in str(exc), (label, str(exc))
        made = calls()[before:]
        if not good:
            assert made == [], f"{label} was called for {name!r}: {made}"
            continue
        assert made, f"{label} was never called for the good name {name!r}"
        if label == "kubernetes":
            assert all(p.split("/")[4] == name for p in made if p.startswith("/api/v1/nodes/")), made
        else:
            word = f"NodeName={name}" if label == "slurm" else name
            assert any(word in json.loads(c) for c in made), (label, made)
    # The reboot and ticket hooks are run the same way (repair/step_runner.py).
    before = len(places.hook_calls())
    result = places.loop.run_until_complete(
        run_hook(f"{places.hook} reboot {{node}}", 30, node=name, reason="r")
    )
    made = places.hook_calls()[before:]
    assert (made == []) != good and result.ok == good, (name, made, result)


@pytest.mark.parametrize("name", ["ALL", "all", "All"])
def test_a_scheduler_keyword_is_no_node_name_anywhere(slurm: Any, places: Places, name: str) -> None:
    """On the real slurmctld, `NodeName=ALL` is every node: one enrolled node named so could
    drain the cluster through its own repair. The grammar refuses it at issuance, at the Hello
    and in every backend; Slurm itself shows why."""
    if name == "ALL":
        slurm.scontrol("update", "NodeName=ALL", "State=DRAIN", "Reason=keyword test")
        try:
            assert all("DRAIN" in slurm.state(n)[0] for n in slurm.nodes), "NodeName=ALL drained them all"
        finally:
            slurm.resume_all()
    assert "scheduler keyword" in node_name_problem(name)
    with pytest.raises(Rejection, match="scheduler keyword"):
        Checker(1 << 20, 86400, 300).check_hello(_hello(name))
    for label, backend, calls in places.backends:
        before = len(calls())
        with pytest.raises(BackendError, match="scheduler keyword"):
            places.loop.run_until_complete(backend.cordon(name, "gpufleet: keyword", automation=False))
        assert calls()[before:] == [], label
    import subprocess

    from harness.processes import gpufleet_argv

    secrets = places.hook.parent / "secrets.toml"
    subprocess.run(gpufleet_argv("auth", "init", "--secrets", str(secrets)), capture_output=True, timeout=60)
    issued = subprocess.run(
        gpufleet_argv("auth", "collector-token", name, "--secrets", str(secrets)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert issued.returncode == 2 and "scheduler keyword" in issued.stderr, issued
