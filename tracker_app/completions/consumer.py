"""The completion endpoints served through Channels, streaming with no buffering:
``POST /v1/chat/completions``, ``POST /v1/completions``, and the adapters
``POST /v1/messages`` (Anthropic) and ``POST /v1/responses`` (OpenAI Responses).

One consumer serves them all (:class:`CompletionsConsumer`); each endpoint's
subclass names its parser and its answer shape (and where its key and errors
differ, how), everything else (key, rate limit, the proxy, streaming) is the
same. The consumer only reads the request, hands it to
:class:`~tracker_app.completions.proxy.CompletionProxy` and renders what ``run()`` ends in (a
:class:`~tracker_app.completions.proxy.CompletionResult`).

The whole request is handled in a task of its own, so that the consumer keeps
listening for ``http.disconnect``: a client that goes away cancels the
upstream generation at once, which frees every hop's cache. (Channels'
``AsyncHttpConsumer`` would otherwise stop listening until ``handle`` returns.)
Daphne sends ``http.disconnect`` after a finished response too, which is
when the consumer stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings

from meshnet_site.asgi_limits import RequestTooLarge
from meshnet_site.bearer import bearer_token
from meshnet_site.database import database_call
from meshnet_site.errors import (
    DomainError,
    ErrorKind,
    HttpError,
    anthropic_http_error,
    database_unavailable,
    http_error,
    is_database_outage,
)
from nodes_app.models import LanguageModel
from nodes_app.protocol.sse import SSE_DONE, sse_event
from nodes_app.selectors import language_model_get
from tracker_app.api_keys.authentication import InvalidApiKey
from tracker_app.api_keys.dashboard_session import dashboard_chat_api_key
from tracker_app.api_keys.rate_limit import rate_limit_check
from tracker_app.api_keys.services import api_key_lookup
from tracker_app.completions.answers import AnswerKind
from tracker_app.completions.chat_answer import ChatAnswer
from tracker_app.completions.chat_request import chat_params_for_model, chat_params_parse
from tracker_app.completions.messages_answer import MessagesAnswer
from tracker_app.completions.messages_request import messages_params_parse
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.proxy import CompletionProxy
from tracker_app.completions.proxy_terms import CompletionRequest
from tracker_app.completions.responses_answer import ResponsesAnswer
from tracker_app.completions.responses_request import responses_params_parse
from tracker_app.completions.text_answer import TextCompletionAnswer
from tracker_app.completions.text_request import text_completion_params_parse
from tracker_app.completions.upstream import upstream_transport
from tracker_app.models import ApiKey

logger = logging.getLogger(__name__)

# One kept-alive connection pool to the head nodes for the whole process.
_upstream: httpx.AsyncClient | None = None
# An idle connection is reused for this long only: well inside the 5 s after which a
# node on uvicorn's default closes it, so a request never goes out on a connection
# the node is closing (the read fails, and the node would be banned for it).
UPSTREAM_KEEPALIVE_SECONDS = 2.0


def upstream_client() -> httpx.AsyncClient:
    global _upstream
    if _upstream is None:
        limits = httpx.Limits(
            max_keepalive_connections=64, keepalive_expiry=UPSTREAM_KEEPALIVE_SECONDS
        )
        _upstream = httpx.AsyncClient(transport=upstream_transport(limits))
    return _upstream


async def _discard(event: bytes) -> None:
    """A whole answer's events: the client gets the reply instead."""


def _json(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class MethodNotAllowed(DomainError):
    kind = ErrorKind.NOT_ALLOWED
    code = "method_not_allowed"


class TrackerFailed(DomainError):
    """A bug of ours: the request still ends in the documented error shape."""

    kind = ErrorKind.INTERNAL
    code = "internal_error"


class CompletionsConsumer(AsyncHttpConsumer):
    """A completion endpoint: ``parse`` reads its body, ``answer`` shapes its answer,
    ``error_answer`` its errors, ``stream_end`` ends its streams."""

    answer: AnswerKind
    stream_end: bytes = sse_event(SSE_DONE)
    # No channel layer: a chat request receives nothing from other processes, and
    # joining the layer would cost every request a Redis round trip and fail it
    # while Redis is away (an alias that is not configured gives no layer).
    channel_layer_alias = None
    proxy: CompletionProxy | None = None
    task: asyncio.Task[None] | None = None
    _streaming = False
    _received = 0
    _refused = False

    async def http_request(self, message: dict[str, Any]) -> None:
        if self._refused:
            return
        chunk = message.get("body", b"")
        self._received += len(chunk)
        if self._received > settings.MESHNET_MAX_REQUEST_BYTES:
            # Headers that lied about the length: refuse before buffering more.
            self._refused = True
            await self._send_error(
                RequestTooLarge(
                    f"Request body is larger than {settings.MESHNET_MAX_REQUEST_BYTES} bytes"
                )
            )
            return
        self.body.append(chunk)
        if not message.get("more_body"):
            self.task = asyncio.create_task(self.handle(b"".join(self.body)))

    async def handle(self, body: bytes) -> None:
        try:
            await self._serve(body)
        except asyncio.CancelledError:
            if self.proxy is not None:
                await asyncio.shield(self.proxy.fail("client disconnected", cancelled=True))
            raise
        except Exception as error:
            if is_database_outage(error):
                # Not a bug: the database is away. The record cannot be written now;
                # if one was opened, the abandoned-request sweep closes it later.
                logger.warning(
                    "request %s: the database is unavailable", self._request_id(), exc_info=True
                )
                await self._end_with(database_unavailable())
                return
            # A bug of ours must still end the request in the documented shape, and
            # its record must not stay "processing".
            logger.exception("request %s: failed inside the tracker", self._request_id())
            if self.proxy is not None:
                await asyncio.shield(self.proxy.fail("the tracker failed to serve this request"))
            await self._end_with(TrackerFailed("The tracker failed to serve this request"))

    def _request_id(self) -> str:
        return self.proxy.request_id if self.proxy is not None else "(not started)"

    async def _end_with(self, error: DomainError) -> None:
        """End the request with ``error``: an error event once streaming, else a response."""
        if self._streaming and self.proxy is not None:
            await self.send_body(self.proxy.answer.failed(error) + self.stream_end)
        else:
            await self._send_error(error)

    async def _serve(self, body: bytes) -> None:
        try:
            if self.scope["method"] != "POST":
                raise MethodNotAllowed("Use POST")
            api_key, model, params = await database_call(self._admitted)(
                key=self.api_key(), body=body, now=time.time()
            )
            self.proxy = CompletionProxy(
                CompletionRequest(params=params, api_key=api_key, model=model, answer=self.answer),
                client=upstream_client(),
            )
            await self.proxy.start()
        except DomainError as error:
            await self._send_error(error)
            return
        if params.stream:
            await self._stream(self.proxy)
        else:
            await self._reply(self.proxy)

    def _admitted(
        self, *, key: str | None, body: bytes, now: float
    ) -> tuple[ApiKey, LanguageModel, GenerationParams]:
        """The request's key, model and parameters as the model takes them, its request
        counted against the key's rate limit; raises the first thing that refuses it, in
        this order: the key, the rate, the body, the model, the parameters for the model.

        Nothing of the body is read before the key is known good and its request
        counted: a ``response_format`` or ``tools`` compiles into a grammar, which costs
        CPU that an anonymous or over-limit client must not spend. One call on a
        database thread (the reads, the parsing, the tokenizer's checks and the count),
        so the request takes one pooled connection and no time of the event loop.
        """
        if key is not None:
            api_key = api_key_lookup(plain=key)
        else:
            # No key: the dashboard chats as its logged-in staff user.
            api_key = dashboard_chat_api_key(scope=self.scope)
        if api_key is None:
            raise InvalidApiKey("Missing or invalid API key: send 'Authorization: Bearer <key>'")
        rate_limit_check(
            key_hash=api_key.key_hash, limit=settings.MESHNET_RATE_LIMIT_PER_MINUTE, now=now
        )
        parsed = self.parse(body, max_choices=settings.MESHNET_MAX_CHOICES)
        model = language_model_get(key=parsed.model)
        return api_key, model, self.for_model(parsed, model)

    def parse(self, body: bytes, *, max_choices: int) -> GenerationParams:
        raise NotImplementedError

    def for_model(self, params: GenerationParams, model: LanguageModel) -> GenerationParams:
        """``params`` as ``model`` takes them (run on a database thread, off the event loop)."""
        return params

    async def disconnect(self) -> None:
        # The task records the cancellation itself (see handle).
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def _stream(self, proxy: CompletionProxy) -> None:
        self._streaming = True
        await self.send_headers(
            status=200,
            headers=[
                (b"Content-Type", b"text/event-stream"),
                (b"Cache-Control", b"no-cache"),
                (b"X-Accel-Buffering", b"no"),
            ],
        )
        await proxy.run(self._send_event)
        await self.send_body(self.stream_end, more_body=False)

    async def _send_event(self, event: bytes) -> None:
        await self.send_body(event, more_body=True)

    async def _reply(self, proxy: CompletionProxy) -> None:
        # Read the head's stream even here, so the Call wall shows live progress.
        result = await proxy.run(_discard)
        if result.error is not None:
            await self._send_error(result.error)
            return
        await self.send_response(
            200, _json(result.reply), headers=[(b"Content-Type", b"application/json")]
        )

    def _header(self, name: bytes) -> str:
        headers = dict(self.scope.get("headers", []))
        return headers.get(name, b"").decode(errors="replace")

    def api_key(self) -> str | None:
        """The API key the request's ``Authorization`` header bears, if any."""
        return bearer_token(self._header(b"authorization"))

    def error_answer(self, error: DomainError) -> HttpError:
        """``error`` as this endpoint's clients read errors (OpenAI's shape)."""
        return http_error(error)

    async def _send_error(self, error: DomainError) -> None:
        answer = self.error_answer(error)
        headers = [(b"Content-Type", b"application/json")]
        headers += [(k.encode(), v.encode()) for k, v in answer.headers.items()]
        await self.send_response(answer.status, _json(answer.body), headers=headers)


class ChatCompletionsConsumer(CompletionsConsumer):
    """``POST /v1/chat/completions``."""

    answer = ChatAnswer

    def parse(self, body: bytes, *, max_choices: int) -> GenerationParams:
        return chat_params_parse(body, max_choices=max_choices)

    def for_model(self, params: GenerationParams, model: LanguageModel) -> GenerationParams:
        return chat_params_for_model(params, weight_source=model.weight_source)


class TextCompletionsConsumer(CompletionsConsumer):
    """``POST /v1/completions``: OpenAI's legacy text completions."""

    answer = TextCompletionAnswer

    def parse(self, body: bytes, *, max_choices: int) -> GenerationParams:
        return text_completion_params_parse(body, max_choices=max_choices)


class MessagesConsumer(CompletionsConsumer):
    """``POST /v1/messages``: the Anthropic Messages API (ADR-0024), its key in
    ``x-api-key`` or ``Authorization: Bearer``, its errors in Anthropic's shape."""

    answer = MessagesAnswer
    stream_end = b""  # Anthropic's stream ends with its message_stop event

    def parse(self, body: bytes, *, max_choices: int) -> GenerationParams:
        return messages_params_parse(body)

    def for_model(self, params: GenerationParams, model: LanguageModel) -> GenerationParams:
        return chat_params_for_model(params, weight_source=model.weight_source)

    def api_key(self) -> str | None:
        return self._header(b"x-api-key").strip() or super().api_key()

    def error_answer(self, error: DomainError) -> HttpError:
        return anthropic_http_error(error)


class ResponsesConsumer(CompletionsConsumer):
    """``POST /v1/responses``: OpenAI's Responses API, stateless (ADR-0024)."""

    answer = ResponsesAnswer
    stream_end = b""  # the stream ends with response.completed (or .incomplete)

    def parse(self, body: bytes, *, max_choices: int) -> GenerationParams:
        return responses_params_parse(body)

    def for_model(self, params: GenerationParams, model: LanguageModel) -> GenerationParams:
        return chat_params_for_model(params, weight_source=model.weight_source)
