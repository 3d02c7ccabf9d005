"""The Celery app: `celery -A worker.celery_app worker` and `celery -A worker.celery_app flower`.

Configuration is read from the settings when Celery first needs it (on_configure), not at import time.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, task_received, worker_process_shutdown, worker_ready, worker_shutdown

from worker.keys import EXTRACT_QUEUE, PERSIST_QUEUE
from worker.settings import Settings, get_settings

log = logging.getLogger("memory.worker")

EXTRACT_TASK = "memory.extract_episode"
PERSIST_TASK = "memory.persist_episode"


def celery_config(settings: Settings) -> dict[str, Any]:
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": settings.unacked_restore_interval_s,
        "unacked_restore_throttle": settings.unacked_restore_throttle,
    }
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.redis_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": transport,
        "result_backend_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        "result_expires": settings.result_expires_s,
        "task_time_limit": settings.task_time_limit_s,
        "worker_send_task_events": True,  # Flower sees received, started, retried, succeeded, failed
        "worker_consumer": "worker.consumer:Consumer",  # task events sent in batches
        # No task-sent event (the worker that receives a task reports it) and no STARTED state in the result
        # backend (wait() reads only final states; Flower has the task-started event): three Redis round
        # trips less per task.
        "task_send_sent_event": False,
        "task_track_started": False,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_default_queue": EXTRACT_QUEUE,
        "task_routes": {EXTRACT_TASK: {"queue": EXTRACT_QUEUE}, PERSIST_TASK: {"queue": PERSIST_QUEUE}},
        "include": ["tasks.episodes"],
    }


def args_repr(task_name: str, episode_id: str) -> str:
    """What events, Flower and logs show of a stage's arguments: the episode id, never its payload."""
    return f"(<episode {episode_id}>,)" if task_name == EXTRACT_TASK else f"(<extraction of {episode_id}>,)"


def extract_signature(app: Celery, payload: dict[str, Any], episode_id: str) -> Any:
    """The extract stage, published straight to its queue (the anonymous exchange: no binding lookup).

    argsrepr is set so that the conversation text never reaches task events, Flower or logs; the
    result is ignored (it travels to persist in the chain), so the caller subscribes to nothing.
    """
    return app.signature(
        EXTRACT_TASK,
        args=(payload,),
        queue=EXTRACT_QUEUE,
        exchange="",
        routing_key=EXTRACT_QUEUE,
        ignore_result=True,
        argsrepr=args_repr(EXTRACT_TASK, episode_id),
        kwargsrepr="{}",
    )


def persist_task_id(episode_id: str) -> str:
    """One id per episode for its final stage, so a re-enqueued episode (sweep, replay) reports its outcome
    where the caller's receipt looks for it."""
    return f"persist:{episode_id}"


def persist_signature(app: Celery, episode_id: str, payload: dict[str, Any] | None = None) -> Any:
    """The persist stage: chained after extract (payload None), or on its own for a dead-letter replay."""
    return app.signature(
        PERSIST_TASK,
        args=(payload,) if payload is not None else (),
        queue=PERSIST_QUEUE,
        exchange="",
        routing_key=PERSIST_QUEUE,
        argsrepr=args_repr(PERSIST_TASK, episode_id),
        kwargsrepr="{}",
        task_id=persist_task_id(episode_id),
    )


app = Celery("memory")


def tune_kombu(settings: Settings) -> None:
    """kombu's Redis transport as the worker runs it (each idempotent): one client pool per process,
    acknowledgements sent in batches, messages taken in batches."""
    from worker.kombu_acks import batch_acks
    from worker.kombu_clients import reuse_redis_clients
    from worker.kombu_fetch import batch_fetch

    reuse_redis_clients()
    batch_acks(settings.ack_batch_ms)
    batch_fetch(settings.fetch_batch)


def _configure(sender: Celery, **_: Any) -> None:
    import celery.app.trace

    settings = get_settings()
    sender.conf.update(celery_config(settings))
    tune_kombu(settings)
    # Celery logs a task's return value on success; ours can hold conversation text. Ids and timing only.
    celery.app.trace.LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss"


def _close_connections(**_: Any) -> None:
    from worker.liveness import stop_current
    from worker.runtime import shutdown_runtime

    stop_current()
    shutdown_runtime()


def _announce(**_: Any) -> None:
    """Start this worker's heartbeat as soon as it is ready (worker/liveness.py)."""
    from worker.liveness import current

    settings = get_settings()
    current(settings.redis_url, settings.worker_dead_after_s)


def _prepare_schema(sender: Any = None, **_: Any) -> None:
    """Ensure the graph schema as soon as the worker is ready, in the background, not in its first tasks
    (each persist waits for it; a failure here leaves it to them). Only for this app's workers: another app
    that imports this module (the benchmarks' no-op app) gets none."""
    import threading

    if getattr(sender, "app", app) is not app:
        return

    threading.Thread(target=_ensure_schema, name="schema", daemon=True).start()


def _ensure_schema() -> None:
    from worker.runtime import runtime

    try:
        runtime().ensure_schema()
    except Exception as exc:  # Neo4j away: the first persist ensures it, and retries on failure
        log.warning("schema not ensured at start", extra={"error_class": type(exc).__name__})


def _note_received(request: Any = None, **_: Any) -> None:
    """Every message this worker receives (a retry waiting for its countdown too) is noted as held by it."""
    from worker.liveness import current

    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if tag:
        settings = get_settings()
        current(settings.redis_url, settings.worker_dead_after_s).hold(str(tag))


def _load_litellm(sender: Any = None, **_: Any) -> None:
    """litellm takes seconds to import: a worker that will call it (it consumes the extract queue, with a
    real model or embeddings) loads it as soon as it is ready, in the background, not inside its first
    extractions (many threads at once, which can outlast a visibility timeout and have their message handed
    out again). A persist-only worker never loads it."""
    import threading

    from worker.offline import MODEL_NAME as OFFLINE

    settings = get_settings()
    consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in getattr(consumer, "queues", [])} if consumer is not None else {EXTRACT_QUEUE}
    if EXTRACT_QUEUE in queues and (settings.llm_model != OFFLINE or settings.embedding_model):
        threading.Thread(target=_import_litellm, name="litellm-import", daemon=True).start()


def _import_litellm() -> None:
    from worker.llm.client import litellm_module

    try:
        litellm_module()
    except Exception as exc:  # each extraction imports it again and fails (and retries) on its own
        log.error("litellm import failed", extra={"error_class": type(exc).__name__})


def _log_fields(logger: Any = None, **_: Any) -> None:
    """Celery's log lines of the memory.* loggers carry their ids and error classes (worker/log_fields.py)."""
    from worker.log_fields import add_fields_to

    if logger is not None:
        add_fields_to(logger)


def _task_lines(**_: Any) -> None:
    """Celery logs a line for every task received and one for every task succeeded: 600 lines a second at
    300 episodes a second, about 5% of a worker's CPU. Unless MEMORY_TASK_LOG_LINES asks for them, only
    their warnings and errors are logged (a failure, a rejected message); a retry and a dead letter have
    lines of their own (tasks/base.py), and Flower's task events carry every task."""
    if not get_settings().task_log_lines:
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)


app.on_configure.connect(_configure)
after_setup_logger.connect(_log_fields)
after_setup_logger.connect(_task_lines)
worker_ready.connect(_announce)
worker_ready.connect(_load_litellm)
worker_ready.connect(_prepare_schema)
task_received.connect(_note_received)
worker_process_shutdown.connect(_close_connections)
worker_shutdown.connect(_close_connections)
