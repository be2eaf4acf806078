from __future__ import annotations

import pytest
from django.core.management import call_command

from agents.models import Run
from tests.helpers import call, final

pytestmark = pytest.mark.django_db


def verify(*ids: int) -> tuple[int, str]:
    import io

    out = io.StringIO()
    try:
        call_command("verify_runs", *[str(i) for i in ids], stdout=out)
        return 0, out.getvalue()
    except SystemExit as exc:
        return int(exc.code), out.getvalue()


def test_verify_runs_passes_on_finished_failed_and_waiting_runs(launch, drive) -> None:
    drive(launch([call("echo", text="a"), final()]))
    drive(launch([call("fail", x=1)] * 3 + [final()]))
    drive(launch([call("fetch_fixture", text="page"), call("ledger_write", entry=1), final()]))
    drive(launch([{"call": {"tool": "nope", "args": 1}}, final()], approver="none"))
    code, out = verify()
    assert code == 0, out
    assert "4 run(s) checked, 0 inconsistent" in out


@pytest.mark.parametrize(
    "tamper",
    [{"state": "failed"}, {"steps": 99}, {"cost_micros": 5}, {"tainted": True}, {"version": 3}, {"answer": "forged"}],
)
def test_verify_runs_fails_on_a_tampered_cache(launch, drive, tamper) -> None:
    good = drive(launch([call("echo", text="a"), final("real")]))
    bad = drive(launch([call("echo", text="a"), final("real")]))
    Run.objects.filter(pk=bad.pk).update(**tamper)
    code, out = verify()
    assert code == 1
    assert f"run {bad.pk}:" in out and f"run {good.pk}:" not in out
