"""Celery's own ceiling, for bench_ingest: the write path's two stages as no-op tasks on the broker settings
of the real app (worker/celery_app.py), on queues of their own. Started as `celery -A
tests.benchmarks.noop_app worker`; the task that ends an episode counts its runs in Redis, like the stats the
real one keeps.

Two shapes: `first` → `second`, two tasks per episode (the write path before inline persistence), and
`only` → `second`, where `only` ends the chain and stores the outcome itself, as the real extract task does
when it writes its extraction inline (one task per episode; `second` never runs).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task, states

from worker.celery_app import celery_config, tune_kombu
from worker.settings import get_settings

FIRST_QUEUE = "bench.noop.first"
SECOND_QUEUE = "bench.noop.second"
FIRST = "bench.noop_first"
SECOND = "bench.noop_second"
ONLY = "bench.noop_only"
DONE_KEY = "bench:noop:done"

app = Celery("noop")


def _configure(sender: Celery, **_: Any) -> None:
    config = celery_config(get_settings())
    config.update(
        include=[],
        task_default_queue=FIRST_QUEUE,
        task_routes={FIRST: {"queue": FIRST_QUEUE}, ONLY: {"queue": FIRST_QUEUE}, SECOND: {"queue": SECOND_QUEUE}},
    )
    sender.conf.update(config)
    tune_kombu(get_settings())  # messages taken and acknowledged as the real worker does


app.on_configure.connect(_configure)


@app.task(name=FIRST, ignore_result=True)  # type: ignore[untyped-decorator]
def first(payload: dict[str, Any]) -> dict[str, Any]:
    return {"episode_id": payload["id"], "status": "extracted", "payload": payload}


@app.task(name=SECOND)  # type: ignore[untyped-decorator]
def second(payload: dict[str, Any]) -> dict[str, Any]:
    app.backend.client.incr(DONE_KEY)
    return {"episode_id": payload["episode_id"], "status": "persisted"}


@app.task(name=ONLY, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def only(self: Task, payload: dict[str, Any]) -> dict[str, Any]:
    self.request.chain = None
    outcome = {"episode_id": payload["id"], "status": "persisted"}
    self.backend.store_result(f"noop:{payload['id']}", outcome, states.SUCCESS)
    app.backend.client.incr(DONE_KEY)
    return outcome
