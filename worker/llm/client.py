"""One LLM call through litellm: primary model then fallbacks, structured output, timeout, usage and cost.

No retry loop lives here: a failed call raises LLMError (classified once, in classify.py) and the task layer
decides whether and when to try again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from worker.errors import LLMError
from worker.llm.classify import classify_llm_error
from worker.llm.ratelimit import RedisTokenBucket
from worker.prompts.portable_schema import portable_schema
from worker.settings import Settings

log = logging.getLogger(__name__)

ChatMessages = list[dict[str, str]]
MessagesFor = Callable[[bool], ChatMessages]  # schema_in_prompt → messages


@dataclass(frozen=True)
class LLMUsage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: LLMUsage) -> LLMUsage:
        return LLMUsage(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True)
class LLMReply:
    text: str
    model: str
    messages: ChatMessages = field(repr=False)
    usage: LLMUsage


@dataclass(frozen=True)
class ModelRoute:
    model: str
    schema_output: bool  # response_format json_schema; else JSON mode with the schema in the prompt


def litellm_module() -> ModuleType:
    """Import litellm on first use only (≈6 s, ≈200 MB): `import worker` and `import api_stub` stay light."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price list
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    return litellm


@lru_cache(maxsize=8)
def resolve_routes(models: tuple[str, ...], mode: str) -> tuple[ModelRoute, ...]:
    """The ordered, de-duplicated models and how to ask each for JSON, computed once per process."""
    litellm = litellm_module() if mode == "auto" else None
    routes = []
    for model in dict.fromkeys(models):
        if mode == "auto" and litellm is not None:
            try:
                schema = bool(litellm.supports_response_schema(model=model))
            except Exception:  # unknown to litellm's model map: JSON mode is the safe choice
                schema = False
        else:
            schema = mode == "json_schema"
        routes.append(ModelRoute(model, schema))
    return tuple(routes)


class LLMClient:
    def __init__(self, settings: Settings, limiter: RedisTokenBucket | None = None) -> None:
        self._settings = settings
        self._limiter = limiter

    @property
    def routes(self) -> tuple[ModelRoute, ...]:
        s = self._settings
        return resolve_routes((s.llm_model, *s.llm_fallback_models), s.llm_structured_output)

    def complete(
        self, messages_for: MessagesFor, response_model: type[BaseModel], *, only_model: str | None = None
    ) -> LLMReply:
        """Ask the primary model, then each fallback, until one answers; raise LLMError if none does."""
        routes = [r for r in self.routes if only_model is None or r.model == only_model] or [
            ModelRoute(only_model or self._settings.llm_model, False)
        ]
        failures = []
        for route in routes:
            messages = messages_for(not route.schema_output)
            try:
                return self._call(route, messages, response_model)
            except LLMError:
                raise  # our own rate limiter: the same for every model
            except Exception as exc:
                failure = classify_llm_error(exc)
                log.warning(
                    "llm call failed",
                    extra={"model": route.model, "error_class": failure.error_class, "reason": failure.reason},
                )
                failures.append(failure)
        hints = [f.retry_after_s for f in failures if f.retry_after_s is not None]
        last = failures[-1]
        raise LLMError(
            f"LLM call failed on {len(failures)} model(s): " + ", ".join(f.reason for f in failures),
            transient=any(f.transient for f in failures),
            cause=last.error_class,
            retry_after_s=max(hints) if hints else None,
        )

    def _call(self, route: ModelRoute, messages: ChatMessages, response_model: type[BaseModel]) -> LLMReply:
        litellm = litellm_module()
        s = self._settings
        kwargs: dict[str, Any] = {
            "model": route.model,
            "messages": messages,
            "timeout": s.llm_timeout_s,
            "max_tokens": s.llm_max_tokens,
            "temperature": 0,
            "num_retries": 0,  # litellm's own retries: off, the task layer retries
            "max_retries": 0,  # the OpenAI SDK's retries: off as well
        }
        if s.llm_api_base:
            kwargs["api_base"] = s.llm_api_base
        if s.llm_api_key:
            kwargs["api_key"] = s.llm_api_key.get_secret_value()
        if route.schema_output:
            schema = {"name": response_model.__name__, "schema": portable_schema(response_model), "strict": True}
            kwargs["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            kwargs["response_format"] = {"type": "json_object"}
        if self._limiter is not None:
            self._limiter.acquire()
        response = litellm.completion(**kwargs)
        text = response.choices[0].message.content or ""
        usage = getattr(response, "usage", None)
        cost = _cost_usd(litellm, response)
        return LLMReply(
            text=text,
            model=route.model,
            messages=messages,
            usage=LLMUsage(
                calls=1,
                prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                cost_usd=cost,
            ),
        )


def _cost_usd(litellm: ModuleType, response: Any) -> float:
    """What litellm priced the call at: it prices every response as it returns it (`response_cost` in its
    hidden params), so it is read from there, and computed again only when absent. A model without a
    known price costs "unknown", recorded as 0."""
    try:
        hidden = getattr(response, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        if cost is None:
            cost = litellm.completion_cost(completion_response=response)
        return float(cost or 0.0)
    except Exception:
        return 0.0


def build_client(settings: Settings, redis_factory: Callable[[], Any] | None = None) -> LLMClient:
    """A client with the shared rate limit when one is configured."""
    limiter = None
    if settings.llm_requests_per_minute > 0:
        from redis import Redis

        redis = redis_factory() if redis_factory else Redis.from_url(settings.redis_url)
        from worker.keys import LLM_RATE_LIMIT

        limiter = RedisTokenBucket(redis, LLM_RATE_LIMIT, settings.llm_requests_per_minute, settings.llm_timeout_s)
    return LLMClient(settings, limiter)


__all__: Sequence[str] = ("LLMClient", "LLMReply", "LLMUsage", "ModelRoute", "build_client", "litellm_module")
