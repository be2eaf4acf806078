"""A real worker killed after the run's last transition committed, in the middle of
delivering its event: after a restart the event is delivered again under the same
webhook-id (at least once), and the interrupted attempt stays on the record."""

from __future__ import annotations

import threading

from agents.models import Delivery, OutboxEvent, Run
from tests.helpers import final, wait_for
from tests.webhook_receiver import Receiver, add_webhook
from tests.workers.cluster import MARKS, Cluster

pytestmark = MARKS

NOTIFY = {
    "AIRLOCK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "AIRLOCK_WEBHOOK_TIMEOUT": "1",  # a claimed attempt is due again 2 * 1 + 5 s later
    "AIRLOCK_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
}


def test_worker_killed_mid_delivery_delivers_after_restart(
    cluster: Cluster, receiver: Receiver, launch, settings
) -> None:
    settings.AIRLOCK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver.secret = add_webhook(receiver.url, "run.done")
    receiver.hold = threading.Event()  # the first request waits while we kill its sender
    cluster.start_worker("doomed", **NOTIFY)
    run = launch([final("shipped")])

    wait_for(receiver.arrived.is_set, timeout=60, what="the first delivery to reach the receiver")
    cluster.kill("doomed")
    assert Run.objects.get(pk=run.pk).state == "done"
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)  # sent, never recorded
    assert delivery.attempt_rows.get().finished_at is None
    receiver.hold.set()

    cluster.start_worker("healthy", **NOTIFY)
    cluster.start_beat(**NOTIFY)
    wait_for(
        lambda: Delivery.objects.filter(status="delivered").exists(), timeout=90, what="delivery after the restart"
    )
    event = OutboxEvent.objects.get(run=run)
    assert [r.msg_id for r in receiver.requests] == [event.msg_id, event.msg_id]
    assert all(not r.refused and r.payload["type"] == "run.done" for r in receiver.requests)
    attempts = [(a.number, a.status_code, a.finished_at is None) for a in Delivery.objects.get().attempt_rows.all()]
    assert attempts == [(1, None, True), (2, 200, False)]
