"""The process tree behind `lapse run` and `lapse demo`."""

from __future__ import annotations

from pathlib import Path

from lapse.kernel.settings import load_settings
from lapse.shell.supervisor import Role, Supervisor


def write_worker_id(settings, kwargs) -> None:
    Path(kwargs["out"]).write_text(settings.runtime.worker_id)


def test_each_role_process_is_its_own_claim_owner(tmp_path):
    settings = load_settings(runtime={"worker_id": "host-1"})
    roles = [Role(f"process-{i}", write_worker_id, {"out": str(tmp_path / f"{i}.txt")}) for i in range(2)]
    sup = Supervisor(settings, roles)
    sup.start()
    sup.watch(until=lambda: all(not p.is_alive() for p in sup.procs.values()), poll_s=0.1)
    sup.shutdown()
    owners = {(tmp_path / f"{i}.txt").read_text() for i in range(2)}
    assert len(owners) == 2
    assert all(owner.startswith("host-1/process-") for owner in owners)
