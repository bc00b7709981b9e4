"""The overview's verdict from a status report: each signal out of bounds adds its reason and
degrades or fails the verdict; the findings (open circuits, the last audit, the reconciler's
anomalies) count like the ledger's figures."""

from __future__ import annotations

import copy

import pytest

from lapse.kernel.settings import Settings
from lapse.shell.console.verdict import DEGRADED, FAILING, HEALTHY, judge
from lapse.shell.console.views import mark_judged

QUIET = {
    "oldest_eligible_age_s": None,
    "outbox": {"unsent": 0, "oldest_unsent_age_s": None},
    "lag": [{"group": "g", "topic": "t", "records": 0, "seconds": 0.0}],
    "expired_claims": {"count": 0},
    "dead_letters": 0,
    "findings": {"open_circuits": [], "reconciler": None, "audit": None},
}


def report(**findings) -> dict:
    r = copy.deepcopy(QUIET)
    r["findings"].update(findings)
    return r


def finding(summary: str, **details) -> dict:
    return {"at": "2026-11-30T12:00:00+00:00", "until": None, "summary": summary, "details": details}


def test_a_quiet_report_is_healthy_and_so_are_good_findings():
    assert judge(QUIET).state == HEALTHY and judge(QUIET).reasons == []
    good = report(audit=finding("invariants hold", verdict="invariants hold"),
                  reconciler=finding("0 missed", anomalies={}))
    assert judge(good).state == HEALTHY


@pytest.mark.parametrize(("findings", "state", "says"), [
    ({"open_circuits": [{**finding("open"), "subject": "lapse.expiry[3]", "until": "2026-11-30T13:00:00+00:00"}]},
     DEGRADED, "circuit open on lapse.expiry[3]"),
    ({"audit": finding("invariants broken: 2 applied twice", verdict="broken")}, FAILING, "2 applied twice"),
    ({"audit": finding("audit incomplete", verdict="incomplete")}, DEGRADED, "audit incomplete"),
    ({"reconciler": finding("1 anomalies", anomalies={"ledger_without_subject": 1})}, DEGRADED, "1 anomalies"),
])
def test_each_finding_out_of_bounds_gives_its_reason(findings, state, says):
    verdict = judge(report(**findings))
    assert verdict.state == state
    assert len(verdict.reasons) == 1 and says in verdict.reasons[0]


def test_a_failing_signal_is_not_softened_by_a_later_degraded_one():
    r = report(audit=finding("broken", verdict="broken"),
               reconciler=finding("anomalies", anomalies={"x": 2}))
    assert judge(r).state == FAILING and len(judge(r).reasons) == 2


def test_a_report_from_before_findings_were_kept_is_judged_without_them():
    old = {k: v for k, v in QUIET.items() if k != "findings"}
    assert judge(old).state == HEALTHY


def test_lag_of_a_group_the_deployment_does_not_run_is_not_judged():
    """Day one of `lapse run`: the analytics group was never started, so its lag (the whole
    outcomes topic) says nothing about this deployment; the cleanup group's lag still counts."""
    groups = Settings().topology.groups
    never = {"group": groups.analytics, "topic": "o", "records": 500, "seconds": 86400.0,
             "group_state": {"state": "dead", "members": 0}, "partitions": [{"committed": None}]}
    cleanup = {**never, "group": groups.cleanup, "records": 0, "seconds": 0.0}
    quiet = {**copy.deepcopy(QUIET), "lag": mark_judged(Settings(), [never, cleanup])}
    assert judge(quiet).state == HEALTHY
    started = {**never, "partitions": [{"committed": 3}]}
    assert judge({**quiet, "lag": mark_judged(Settings(), [started, cleanup])}).state == FAILING
    stalled = {**cleanup, "records": 9, "seconds": 1000.0}
    assert judge({**quiet, "lag": mark_judged(Settings(), [never, stalled])}).state == FAILING
