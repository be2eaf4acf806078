"""The transcript cache (agents/runs/store.py `Transcripts`): a run this process
committed last loads without reading its messages, and anything else reads them."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from agents.actions.approvals import approval_decide
from agents.models import Approval, Message, Run
from agents.runs import store
from tests.helpers import final, tainted_write

pytestmark = pytest.mark.django_db(transaction=True)


def _loaded(run_id: int) -> tuple[list[dict], int]:
    """The run's transcript as `store.load` gives it, and how many message reads that took."""
    run = Run.objects.select_related("profile").get(pk=run_id)
    with CaptureQueriesContext(connection) as captured:
        state = store.load(run)
    reads = sum(1 for q in captured.captured_queries if q["sql"] and 'FROM "agents_message"' in q["sql"])
    return state.messages, reads


def _waiting(launch, drive) -> Run:
    run = drive(launch(tainted_write()))
    assert run.state == "awaiting_approval"
    return run


def test_a_run_this_process_committed_loads_without_reading_its_messages(launch, drive) -> None:
    run = _waiting(launch, drive)
    messages, reads = _loaded(run.pk)
    assert reads == 0
    assert messages == Message.engine_transcript(run) and len(messages) == run.messages_count


def test_a_commit_made_elsewhere_is_read_from_the_database(launch, drive) -> None:
    run = _waiting(launch, drive)
    # Another process appends a message in a transition of its own: the version moves.
    Message.objects.create(run=run, seq=run.version + 1, index=run.messages_count, role="user", content="planted")
    Run.objects.filter(pk=run.pk).update(version=F("version") + 1, messages_count=F("messages_count") + 1)
    messages, reads = _loaded(run.pk)
    assert reads == 1
    assert messages[-1] == {"role": "user", "content": "planted"}


def test_a_rolled_back_commit_leaves_nothing_cached(launch, drive, rita: User) -> None:
    run = _waiting(launch, drive)
    approval = Approval.objects.get(run=run)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert approval_decide(approval_id=approval.pk, user=rita, decision="reject", note="no").won
        inside = Run.objects.values("version", "messages_count").get(pk=run.pk)
        raise RuntimeError("the caller's transaction fails after the decision's commit")
    run.refresh_from_db()
    assert run.state == "awaiting_approval" and run.version == inside["version"] - 1  # rolled back with it
    # Then another process commits that same version, with as many messages.
    planted = [
        Message(run=run, seq=inside["version"], index=i, role="user", content=f"planted {i}")
        for i in range(run.messages_count, inside["messages_count"])
    ]
    Message.objects.bulk_create(planted)
    Run.objects.filter(pk=run.pk).update(version=inside["version"], messages_count=inside["messages_count"])
    messages, reads = _loaded(run.pk)
    assert reads == 1
    assert messages == Message.engine_transcript(run)
    assert [m["content"] for m in messages[run.messages_count:]] == [m.content for m in planted]


def test_a_finished_run_is_never_kept(launch, drive) -> None:
    run = drive(launch([final("done")]))
    assert run.state == "done"
    _messages, reads = _loaded(run.pk)
    assert reads == 1


def test_the_cache_holds_at_most_its_bound_in_messages(launch, drive, settings) -> None:
    first = _waiting(launch, drive)
    settings.AIRLOCK_TRANSCRIPT_CACHE = first.messages_count  # room for one such run
    second = _waiting(launch, drive)
    assert _loaded(second.pk)[1] == 0
    assert _loaded(first.pk)[1] == 1  # pushed out by the second
    assert _loaded(second.pk)[1] == 1  # and the first's read pushed the second out


def test_an_id_given_to_another_run_is_not_that_run(launch, drive) -> None:
    run = _waiting(launch, drive)
    # A database flushed or restored can give a new run an id the cache has seen.
    Run.objects.filter(pk=run.pk).update(created_at=run.created_at + dt.timedelta(seconds=1))
    assert _loaded(run.pk)[1] == 1


def test_off_reads_every_time(launch, drive, settings) -> None:
    settings.AIRLOCK_TRANSCRIPT_CACHE = 0
    run = _waiting(launch, drive)
    assert _loaded(run.pk)[1] == 1
    assert _loaded(run.pk)[1] == 1
