"""The overview's verdict: healthy, degraded or failing, with the reasons, judged from the figures
of `lapse status` (`lapse.readers.status.status_report`) against the limits below."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEALTHY, DEGRADED, FAILING = "healthy", "degraded", "failing"

# Ages (seconds) past which a signal degrades the verdict, and past which it fails it.
ELIGIBLE_AGE_S = (60.0, 900.0)
OUTBOX_AGE_S = (30.0, 300.0)
LAG_AGE_S = (60.0, 900.0)
# Audit verdicts that count against health: broken fails it, incomplete degrades it.
AUDIT_FAILS = ("broken", "incomplete")


@dataclass
class Verdict:
    """The verdict and why: one reason per signal out of bounds (none when healthy)."""

    state: str = HEALTHY
    reasons: list[str] = field(default_factory=list)

    def add(self, state: str, reason: str) -> None:
        self.reasons.append(reason)
        if state == FAILING or self.state == HEALTHY:
            self.state = state


def _age(verdict: Verdict, what: str, age: float | None, limits: tuple[float, float]) -> None:
    if age is None or age < limits[0]:
        return
    state = FAILING if age >= limits[1] else DEGRADED
    verdict.add(state, f"{what} is {age:.0f}s old (degraded from {limits[0]:.0f}s, failing from {limits[1]:.0f}s)")


def judge(report: dict[str, Any]) -> Verdict:
    """The verdict of a status report (lag only of the rows marked judged, or not marked): lag that
    cannot be read, ages past the failing limits and a broken last audit fail it; dead letters
    waiting, expired claims, ages past the degraded limits, open dead-letter circuits, an
    incomplete audit and reconciler anomalies degrade it."""
    verdict = Verdict()
    _age(verdict, "the oldest eligible unfinished operation", report.get("oldest_eligible_age_s"), ELIGIBLE_AGE_S)
    _age(verdict, "the oldest unsent outbox row", report["outbox"].get("oldest_unsent_age_s"), OUTBOX_AGE_S)
    for row in report.get("lag", []):
        if not row.get("judged", True):
            continue  # a group this deployment does not run (see views.mark_judged)
        if "error" in row:
            verdict.add(FAILING, f"lag of {row['group']} on {row['topic']} unreadable: {row['error']}")
        else:
            _age(verdict, f"the oldest record {row['group']} has not consumed on {row['topic']}", row["seconds"]
                 if row["records"] else None, LAG_AGE_S)
    claims = report["expired_claims"]["count"]
    if claims:
        verdict.add(DEGRADED, f"{claims} claim(s) past their lease: a worker stopped or stalls")
    if report["dead_letters"]:
        verdict.add(DEGRADED, f"{report['dead_letters']} dead letter(s) wait for an operator")
    found = report.get("findings") or {}
    for circuit in found.get("open_circuits", []):
        verdict.add(DEGRADED, f"dead-letter circuit open on {circuit['subject']} until {circuit['until']}")
    audit = found.get("audit")
    if audit and audit["details"].get("verdict") in AUDIT_FAILS:
        verdict.add(FAILING if audit["details"]["verdict"] == "broken" else DEGRADED,
                    f"the last audit ({audit['at']}): {audit['summary']}")
    reconciler = found.get("reconciler")
    if reconciler and sum(reconciler["details"].get("anomalies", {}).values()):
        verdict.add(DEGRADED, f"the reconciler's last pass ({reconciler['at']}): {reconciler['summary']}")
    return verdict


__all__ = ["DEGRADED", "FAILING", "HEALTHY", "Verdict", "judge"]
