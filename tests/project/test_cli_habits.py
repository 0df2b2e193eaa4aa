"""The `gpufleet` command's habits: --version, --help naming every command, exit codes from one
table that the README quotes, shell completion from the parser, `config check`, `--watch` and
`--json` on the read commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from gpufleet.cli.completion import words
from gpufleet.cli.main import build_parser
from gpufleet.client.exits import Exit, sentence
from gpufleet.common.version import __version__
from harness.paths import REPO
from harness.processes import Cluster, free_port, gpufleet_argv
from harness.waiting import wait_until


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(gpufleet_argv(*argv), capture_output=True, text=True, timeout=60, env=env)


def test_the_readme_quotes_the_exit_code_table() -> None:
    assert sentence() in (REPO / "README.md").read_text()
    assert [int(c) for c in Exit] == [0, 1, 2, 3, 4, 5]


def test_help_names_every_command_and_version_says_the_release() -> None:
    shown = _run("--help").stdout
    for command in words(build_parser())[""]:
        if not command.startswith("-"):
            assert f"    {command} " in shown, command
    assert sentence().split(":")[0] in shown
    version = _run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"gpufleet {__version__}"


def test_exit_codes_for_a_bad_token_file_a_bad_client_config_and_no_aggregator(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLEET_CLIENT_CONFIG": str(tmp_path / "none.toml")}
    missing = _run("nodes", "--token-file", str(tmp_path / "no-such-token"), env=env)
    assert missing.returncode == Exit.USAGE and "cannot read --token-file" in missing.stderr
    bad = tmp_path / "client.toml"
    bad.write_text("fleet = [unclosed\n")
    broken = _run("nodes", env={**os.environ, "GPUFLEET_CLIENT_CONFIG": str(bad)})
    assert broken.returncode == Exit.USAGE and "cannot read client config" in broken.stderr
    nobody = _run("nodes", "--fleet", f"127.0.0.1:{free_port()}", env=env)
    assert nobody.returncode == Exit.UNREACHABLE and "cannot reach" in nobody.stderr
    flag = _run("nodes", "--no-such-flag")
    assert flag.returncode == Exit.USAGE


def test_bash_completion_completes_commands_subcommands_and_flags(tmp_path: Path) -> None:
    script = tmp_path / "gpufleet.bash"
    script.write_text(_run("completion", "bash").stdout)

    def complete(*line: str) -> set[str]:
        words_ = " ".join(f"'{w}'" for w in ("gpufleet", *line))
        out = subprocess.run(
            ["bash", "-c", f"source {script}; COMP_WORDS=({words_}); COMP_CWORD={len(line)}; "
             '_gpufleet; printf "%s\\n" "${COMPREPLY[@]}"'],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return set(out.stdout.split())

    assert complete("no") == {"node", "nodes"}
    assert complete("breaker", "") >= {"reset", "status"}
    assert "--watch" in complete("breaker", "status", "--w")
    assert "--json" in complete("node", "gpu-node-1", "--j"), "a node's name is not taken for a subcommand"
    assert complete("config", "") >= {"check", "reference"}
    zsh = _run("completion", "zsh").stdout
    assert zsh.startswith("autoload -U +X bashcompinit && bashcompinit") and "complete -F _gpufleet" in zsh


def test_config_check_says_what_the_daemons_would_refuse(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[collector]\ninterval_s = 2.0\n\n[aggregator]\ningest_workers = 2\n")
    ok = _run("config", "check", str(good))
    assert ok.returncode == 0 and "[collector] ok" in ok.stdout and "[aggregator] ok" in ok.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[aggregator]\ningest_workers = -3\n\n[colector]\ninterval_s = 1\n")
    refused = _run("config", "check", str(bad), "--json")
    assert refused.returncode == Exit.USAGE
    answer = json.loads(refused.stdout)
    assert not answer["ok"]
    assert "ingest_workers=-3 must be -1" in answer["sections"]["aggregator"]
    assert "unknown section [colector]" in answer["sections"]["colector"]
    unreadable = _run("config", "check", str(tmp_path / "missing.toml"))
    assert unreadable.returncode == Exit.USAGE and "cannot read config file" in unreadable.stdout


def test_watch_refreshes_until_ctrl_c_and_rides_out_an_unreachable_aggregator(cluster: Cluster) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None)
    cluster.collector("watch-node", agg.ingest, "--interval-s", "0.5")
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_CLIENT_CONFIG": "/none",
    }
    out = cluster.tmp / "watch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            gpufleet_argv("nodes", "--watch", "0.5"), stdout=sink, stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_until(
                lambda: (
                    out.read_text().count("every 0.5 s until Ctrl-C") >= 3 and "watch-node" in out.read_text()
                ),
                30,
                "three refreshes of the node list",
            )
            agg.proc.stop(signal.SIGTERM)
            wait_until(
                lambda: "(still watching)" in out.read_text(), 30, "the watch to say the aggregator is gone"
            )
            refreshes = out.read_text().count("every 0.5 s until Ctrl-C")
            wait_until(
                lambda: out.read_text().count("every 0.5 s until Ctrl-C") > refreshes + 1, 30, "it to go on"
            )
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "Traceback" not in out.read_text()
    me = _run("whoami", "--json", env={**env, "GPUFLEET_FLEET": f"127.0.0.1:{free_port()}"})
    assert me.returncode == Exit.UNREACHABLE


def test_whoami_and_the_read_commands_answer_in_json(cluster: Cluster) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None)
    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": cluster.secrets.tokens["viewer"],
        "GPUFLEET_CLIENT_CONFIG": "/none",
    }
    me = json.loads(_run("whoami", "--json", env=env).stdout)
    assert me["role"] == "viewer" and me["fleet"] == agg.fleet
    for argv in (
        ("nodes",),
        ("status",),
        ("metrics",),
        ("incidents",),
        ("audit",),
        ("breaker", "status"),
        ("events", "--since", "1h"),
        ("history", "util_gpu_pct", "--since", "10m"),
    ):
        answer = _run(*argv, "--json", env=env)
        assert answer.returncode == 0, (argv, answer.stderr)
        json.loads(answer.stdout)
