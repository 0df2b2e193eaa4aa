"""The waste findings replayed on generated job patterns (issue 54; repair/replay/waste.py has
the patterns and their sources): at the shipped policy, at most one false idle finding per 1,000
job-hours of work, every allocation idle for the window found; the orphan and outside-allocation
rules find every case and nothing else. Run as a person runs it: `gpufleet replay --generate jobs`."""

from __future__ import annotations

import json
import subprocess

from harness.processes import gpufleet_argv


def test_the_shipped_waste_rules_on_generated_jobs_find_every_case_at_under_one_false_per_1000_hours() -> (
    None
):
    out = subprocess.run(
        gpufleet_argv("replay", "--generate", "jobs", "--jobs", "800", "--seed", "7", "--json"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["jobs"] == 800 and report["busy_job_hours"] > 10_000
    idle = report["rules"]["idle_allocation"]
    assert idle["to_find"] > 100 and idle["missed"] == 0, idle
    assert idle["false_per_1000_busy_job_hours"] <= 1.0, idle
    assert idle["gpu_hours_flagged"] > 0
    for rule in ("orphaned_process", "gpu_outside_allocation"):
        r = report["rules"][rule]
        assert r["to_find"] > 0 and r["missed"] == 0 and r["false"] == 0, (rule, r)
        assert r["findings"] == r["to_find"], (rule, r)


def test_a_window_shorter_than_the_pauses_of_real_work_is_what_makes_false_findings(tmp_path) -> None:
    # The same jobs under a 5-minute window: sparse inference, whose requests mostly fall between
    # two reports, now reads idle for a window while it serves: a hundred times the false rate.
    policy = tmp_path / "short.toml"
    policy.write_text("[rules.idle_allocation]\nwindow_s = 300.0\n")
    out = subprocess.run(
        gpufleet_argv(
            "replay", "--generate", "jobs", "--jobs", "150", "--seed", "7", "--policy", str(policy), "--json"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    idle = json.loads(out.stdout)["rules"]["idle_allocation"]
    assert idle["false_per_1000_busy_job_hours"] > 10.0 and idle["missed"] == 0, idle
