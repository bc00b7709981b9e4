"""`lapse demo` on its embedded default: the tansu broker and an SQLite file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_with_faults_on_embedded_broker_and_sqlite_converges_one_effect_per_op_key(embedded_bootstrap, tmp_path):
    # The demo starts its own embedded broker; the session fixture proves the binary is there
    # and fails the run with the reason if it is not.
    assert embedded_bootstrap
    run = subprocess.run(
        [sys.executable, "-m", "lapse", "demo", "--reservations", "300", "--workers", "2",
         "--state-dir", str(tmp_path), "--json", "--timeout", "150", "--fault-rate", "0.3"],
        capture_output=True, timeout=240, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    summary = json.loads(run.stdout)
    assert summary["ok"] is True
    assert summary["expired"] == 210
    assert summary["released"] == 210 - summary["paid_after_event"]
    assert summary["skipped"] == summary["paid_after_event"] > 0
    assert summary["duplicates_absorbed"] >= summary["duplicates_injected"] > 0
    assert summary["outcomes_published"] >= summary["expired"]
    assert sum(summary["retries_by_attempt"].values()) > 0  # the faulty store forced retries
    assert summary["objects_deleted"] + summary["dead_letters"] == summary["artifacts_expired"] == 75
    assert all(summary["checks"].values())
    # The terminal gets the summary; the roles' log lines go to the state folder's file.
    said = run.stderr.decode().splitlines()
    assert [line.split(" ")[0] for line in said] == ["embedded", "logs"], said
    logged = [json.loads(line) for line in (tmp_path / "demo.log").read_text().splitlines()]
    assert {line["role"] for line in logged} >= {"sweep", "relay", "process-0", "process-1", "demo"}
