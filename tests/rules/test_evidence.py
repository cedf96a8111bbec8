"""The Alertmanager alert book: repeats, HA duplicates and out-of-order notices, by fingerprint."""

from __future__ import annotations

import pytest

from specguard.rules.evidence import AlertBook, AlertRecord

T0 = "2026-11-29T10:00:00.123456789Z"  # Alertmanager writes nanoseconds
T0_OTHER_ZONE = "2026-11-29T12:00:00.123456789+02:00"
T1 = "2026-11-29T11:00:00Z"


def note(status, starts_at=T0, at=0.0):
    return AlertRecord("fp", "SpecDecodeHurts", status, {"task_type": "chat"}, starts_at, at)


@pytest.mark.parametrize(
    ("notices", "outcomes", "status"),
    [
        pytest.param([note("firing"), note("firing")], ["new", "duplicate"], "firing", id="repeat"),
        pytest.param([note("firing"), note("resolved")], ["new", "updated"], "resolved", id="resolve"),
        pytest.param(
            [note("resolved"), note("firing")], ["new", "stale"], "resolved", id="late-firing-same-episode"
        ),
        pytest.param(
            [note("firing"), note("resolved"), note("firing"), note("resolved")],
            ["new", "updated", "stale", "duplicate"],
            "resolved",
            id="retried-firing-between-resolves",
        ),
        pytest.param(
            [note("resolved"), note("firing", T1)], ["new", "updated"], "firing", id="new-episode-reopens"
        ),
        pytest.param(
            [note("firing", T1), note("resolved", T0)], ["new", "stale"], "firing", id="old-episode-resolve"
        ),
        pytest.param(
            [note("resolved"), note("firing", T0_OTHER_ZONE)],
            ["new", "stale"],
            "resolved",
            id="same-instant-other-zone",
        ),
    ],
)
def test_ingest_keeps_the_latest_episode(notices, outcomes, status):
    book = AlertBook()
    assert [book.ingest(n) for n in notices] == outcomes
    assert [r.status for r in book.records()] == [status]


def test_duplicate_refreshes_the_time_received():
    book = AlertBook()
    book.ingest(note("firing", at=1.0))
    book.ingest(note("firing", at=50.0))
    book.expire(now=80.0, firing_ttl=60.0, resolved_ttl=60.0)
    assert len(book) == 1


def test_backward_clock_step_bounds_the_ttl():
    """An alert received "in the future" (the clock stepped back 2 h) expires one TTL from now."""
    book = AlertBook()
    book.ingest(note("firing", at=7200.0))
    book.expire(now=0.0, firing_ttl=60.0, resolved_ttl=60.0)
    assert len(book) == 1
    book.expire(now=61.0, firing_ttl=60.0, resolved_ttl=60.0)
    assert len(book) == 0


# --- the book is bounded; a flood of one kind dedupes to a few per class
def alert(i, status="firing", alertname="Flood", task="chat", at=0.0, **labels):
    labels = {"task_type": task, "alertname": alertname, **labels}
    return AlertRecord(f"fp{i}", alertname, status, labels, T0, at)


def test_a_flood_in_one_class_keeps_the_newest_few():
    book = AlertBook(max_alerts=100, max_per_class=4)
    for i in range(50):
        book.ingest(alert(i))
    assert [r.fingerprint for r in book.snapshot()] == ["fp46", "fp47", "fp48", "fp49"]
    assert book.evicted == 46 and len(book.for_class(("chat", "low", "low"))) == 4


def test_a_full_book_drops_the_oldest_resolved_first():
    book = AlertBook(max_alerts=3, max_per_class=10)
    book.ingest(alert(0, alertname="A"))
    book.ingest(alert(1, "resolved", alertname="B"))
    book.ingest(alert(2, alertname="C"))
    book.ingest(alert(3, alertname="D"))
    assert sorted(r.fingerprint for r in book.snapshot()) == ["fp0", "fp2", "fp3"]
    book.ingest(alert(4, alertname="E"))  # no resolved left: the oldest received goes
    assert sorted(r.fingerprint for r in book.snapshot()) == ["fp2", "fp3", "fp4"]


def test_only_the_labels_the_guard_reads_are_kept():
    book = AlertBook()
    book.ingest(alert(0, pool="spec-k4", instance="x" * 10_000, temperature_bucket="y" * 500))
    labels = book.snapshot()[0].labels
    assert set(labels) == {"task_type", "alertname", "pool", "temperature_bucket"}
    assert len(labels["temperature_bucket"]) == 128


def test_fresh_alerts_are_what_changed_since_the_last_take_and_still_in_the_book():
    book = AlertBook(max_alerts=2, max_per_class=16)
    other = lambda fp: AlertRecord(fp, "SpecDecodeHurts", "firing", {"task_type": "chat"}, T0, 0.0)  # noqa: E731
    book.ingest(note("firing"))
    assert [a.status for a in book.take_fresh()] == ["firing"] and book.take_fresh() == []
    book.ingest(note("firing"))  # a repeat: nothing new to keep
    assert book.take_fresh() == []
    book.ingest(note("resolved"))
    book.ingest(other("b"))
    book.ingest(other("c"))  # the full book evicts the resolved "fp": it is not kept either
    assert [a.fingerprint for a in book.take_fresh()] == ["b", "c"]
