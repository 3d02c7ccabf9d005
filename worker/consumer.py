"""The worker's consumer: Celery's own, with task events sent in batches.

Celery buffers task events (received, started, succeeded...) and flushes the buffer on the event loop's next
turn; at hundreds of tasks a second that is about one Redis PUBLISH, one kombu message and one JSON encoding
per event (2.6 publishes per episode, measured). Here the flush waits `MEMORY_EVENTS_FLUSH_MS`, so one
message carries the events of that interval (Celery itself still flushes when 24 are waiting), and events
held when the connection is lost or the consumer stops are sent first. Flower sees them that much later;
nothing else reads them. At 0, Celery's own behaviour.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from worker.settings import get_settings


class Consumer(CeleryConsumer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._events_flush_s = get_settings().events_flush_ms / 1000
        self._events_flush_due = False
        super().__init__(*args, **kwargs)

    def on_send_event_buffered(self) -> None:
        """Called by whichever thread buffered an event: at most one flush pending at a time."""
        if self._events_flush_s <= 0:
            super().on_send_event_buffered()
            return
        if self.hub is None or self._events_flush_due:
            return
        # Not locked: two threads passing the check at once schedule two flushes, the second finding little
        # or nothing to send (harmless); a lock here would cost every event more than that.
        self._events_flush_due = True
        self.hub.call_soon(self._schedule_events_flush)  # the hub's timer is only touched by its own thread

    def _schedule_events_flush(self) -> None:
        self.hub.call_later(self._events_flush_s, self._flush_due_events)

    def _flush_due_events(self) -> None:
        self._events_flush_due = False  # before the flush: an event buffered during it schedules the next
        self._flush_events()

    def on_close(self) -> None:
        """Before a restart (a lost connection) or a stop: what waits goes out through the dispatcher that
        holds it (Celery carries over only the events whose publish failed), and the next event schedules
        a flush again whatever became of a pending one."""
        self._events_flush_due = False
        self._flush_events()
        super().on_close()

    def shutdown(self) -> None:
        self._flush_events()  # what waits for the next flush goes out before Celery closes the dispatcher
        super().shutdown()
