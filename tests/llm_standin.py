"""A small OpenAI-compatible chat-completions server on 127.0.0.1, scripted per test.

litellm reaches it over real HTTP (model `openai/<name>` with api_base = StandIn.url). Each request is
recorded; each reply comes from the script (in order), else from the default.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    code: str | None = None  # an error's code (OpenAI's error body), e.g. context_length_exceeded


def request_tokens(request: dict[str, Any]) -> int:
    """Tokens a request asks the model to hold: its messages (cl100k_base, 4 a message for the format) and
    the answer's max_tokens."""
    import importlib.util
    import os
    from pathlib import Path

    import tiktoken

    spec = importlib.util.find_spec("litellm")  # litellm ships tiktoken's files (no network here)
    assert spec is not None and spec.origin is not None
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"))
    encoding = tiktoken.get_encoding("cl100k_base")
    messages = request.get("messages") or []
    return sum(len(encoding.encode(str(m.get("content") or ""))) + 4 for m in messages) + int(
        request.get("max_tokens") or 0
    )


def answer(payload: Any) -> Reply:
    return Reply(content=json.dumps(payload, ensure_ascii=False))


class StandIn:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: deque[Reply] = deque()
        self.default: Callable[[dict[str, Any]], Reply] | None = None
        # As a provider does: a request whose messages and max_tokens pass this many tokens (tiktoken's
        # cl100k_base) is refused with OpenAI's context_length_exceeded error. None: no limit.
        self.context_tokens: int | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def calls(self) -> int:
        return len(self.requests)

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def start(self) -> StandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
        if self.context_tokens is not None:
            used = request_tokens(request)
            if used > self.context_tokens:
                return Reply(
                    status=400,
                    content=f"This model's maximum context length is {self.context_tokens} tokens. However, you "
                    f"requested {used} tokens. Please reduce the length of the messages.",
                    code="context_length_exceeded",
                )
        with self._lock:
            if self.script:
                return self.script.popleft()
        if self.default is not None:
            return self.default(request)
        return Reply(status=500, content="no scripted reply")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                body["_at"] = time.time()
                body["_path"] = self.path
                reply = standin._next(body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status == 200:
                    payload: dict[str, Any] = {
                        "id": f"chatcmpl-{len(standin.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "stand-in"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply.content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
                    }
                else:
                    payload = {
                        "error": {
                            "message": reply.content or "error",
                            "type": "invalid_request_error" if reply.code else "stand_in",
                            "code": reply.code or reply.status,
                        }
                    }
                data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

        return Handler
