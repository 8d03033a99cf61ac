"""``horizon serve``'s HTTP app: OpenAI's routes over a :class:`PolicyService`, plus HorizonRL's own
under ``/v1/horizon`` (sessions, env steps, rewards, weight swaps).

Routes:

- ``GET /v1/models``, ``POST /v1/chat/completions`` (``stream: true`` answers server-sent events),
  ``POST /v1/completions`` — OpenAI's, with OpenAI's error shape; ``model`` names the base model or
  a LoRA adapter served over it;
- ``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter`` — vLLM's, serving LoRA adapters
  next to the base model (:mod:`horizonrl.serve.loras`), guarded as weight swaps are;
- ``GET /v1/horizon/sessions/{id}`` — the session's trajectory so far (schema v1);
- ``POST /v1/horizon/sessions/{id}/step`` — run the tool calls of the session's last turn (or the
  calls given) in the env a runner bound to the session; answers the tool messages to send next;
- ``POST /v1/horizon/sessions/{id}/reward`` — close a session with a reward;
- ``POST /v1/horizon/weights`` — load a policy (``checkpoint``) and swap it in between requests
  (only from the allowed checkpoint roots, and only with a token: :mod:`horizonrl.serve.weights`);
- ``GET /health`` — no token needed.

A session is named by the ``X-Session-Id`` header or the request's ``user`` field. A request whose
``Host`` is not one of ``allowed_hosts`` is refused first (400, against DNS rebinding). With a token
configured every route but ``/health`` needs ``Authorization: Bearer <token>`` (what the ``openai``
client sends as its API key); a body over the limit is refused before it is read (413), one that is
not JSON or nests deeper than :data:`horizonrl.asgi.MAX_JSON_DEPTH` is a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from horizonrl.asgi import (
    LOOPBACK_HOSTS,
    HostGate,
    JSONInputError,
    RequestGate,
    client_left,
    load_json,
    unless_client_leaves,
)
from horizonrl.serve.loras import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from horizonrl.serve.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ModelList,
    ToolCallIn,
    bad_request,
    validation_error,
)
from horizonrl.serve.service import PolicyService
from horizonrl.serve.weights import WeightSwaps
from horizonrl.types import Action, Message, ToolCall

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
CLIENT_CLOSED_REQUEST = 499

_TYPES = {401: "authentication_error", 413: "invalid_request_error"}
_CODES = {401: "invalid_api_key", 413: "request_too_large"}


def error_json(exc: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _refuse(status: int, code: str, message: str) -> Response:
    return error_json(
        APIError(
            status, message, type=_TYPES.get(status, "invalid_request_error"), code=_CODES.get(status, code)
        )
    )


class StepRequest(BaseModel):
    """``POST /v1/horizon/sessions/{id}/step``: the calls to run (default: the last turn's)."""

    model_config = ConfigDict(extra="forbid")

    tool_calls: list[ToolCallIn] | None = None


class StepAnswer(BaseModel):
    messages: list[dict[str, Any]]
    reward: float
    done: bool


class RewardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: float = Field(allow_inf_nan=False)
    metrics: dict[str, float] = Field(default_factory=dict)


class WeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(
        min_length=1,
        max_length=4096,
        description="A run, checkpoint, policy, adapter or model directory under a checkpoint root.",
    )


async def _json_body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        data = load_json(raw or b"{}")
    except JSONInputError as exc:
        raise bad_request(str(exc), code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _session_id(request: Request, body: Any) -> str | None:
    header = request.headers.get("x-session-id")
    return header or getattr(body, "user", None) or None


def create_app(
    service: PolicyService,
    *,
    token: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    weight_swaps: WeightSwaps | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> FastAPI:
    """The app over ``service``, answering requests whose ``Host`` is one of ``allowed_hosts``
    (:func:`horizonrl.asgi.allowed_hosts`). ``weight_swaps`` says which policies
    ``/v1/horizon/weights`` may load and how; without it that route is 404."""
    app = FastAPI(title="horizonrl policy server", version="1", summary="OpenAI-compatible policy server")
    app.state.service = service

    @app.exception_handler(APIError)
    async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_json(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        text = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            text += " (routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/horizon/...)"
        return error_json(APIError(exc.status_code, text, type=kind, code=str(exc.status_code)))

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_json(
            APIError(
                500,
                f"internal error: {type(exc).__name__}: {exc}",
                type="server_error",
                code="internal_error",
            )
        )

    docs = (app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
    app.add_middleware(
        RequestGate,
        token=token,
        max_request_bytes=max_request_bytes,
        public_paths={"/health", *(p for p in docs if p)},
        refuse=_refuse,
        too_large_hint="send less or start the server with a higher --max-request-mib",
    )
    app.add_middleware(HostGate, allowed_hosts=allowed_hosts, refuse=_refuse)  # the outermost: first

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": service.model_name,
            "policy_version": service.policy_version,
            "in_flight": service.in_flight,
            "sessions": len(service.sessions),
            "lora_adapters": service.loras.names,
            "engine": service.engine_stats(),
        }

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=service.models())

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Any:
        service.check_model(model_id)
        return next(card for card in service.models() if card.id == model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        body: ChatCompletionRequest = await _json_body(request, ChatCompletionRequest)
        session_id = _session_id(request, body)
        if body.stream:
            return await _stream_response(request, service.chat_stream(body, session_id))
        result = await unless_client_leaves(request, service.chat(body, session_id))
        if result is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        answer = result.model_dump(exclude_none=False)
        answer["horizon"]["server_ms"] = round(1000 * (time.perf_counter() - started), 3)
        return JSONResponse(answer)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: CompletionRequest = await _json_body(request, CompletionRequest)
        result = await unless_client_leaves(request, service.complete(body))
        if result is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return JSONResponse(result.model_dump())

    @app.get("/v1/horizon/sessions/{session_id}")
    async def get_session(session_id: str) -> Any:
        session = service.sessions.get(session_id)
        traj = session.trajectory("finished", session.reward or 0.0, chat=None)
        return JSONResponse({**json.loads(traj.to_json()), "closed": session.closed})

    @app.post("/v1/horizon/sessions/{session_id}/step", response_model=StepAnswer)
    async def step(session_id: str, request: Request) -> StepAnswer:
        body: StepRequest = await _json_body(request, StepRequest)
        session = service.sessions.get(session_id)
        if session.env is None:
            raise bad_request(
                f"session {session_id!r} has no env: /step runs tool calls for sessions a runner opened "
                "(horizon train with agent.kind: external)"
            )
        if session.env_done:
            raise bad_request(f"session {session_id!r}: the episode is over (finish was called)")
        async with session.lock:
            last = next((m for m in reversed(session.messages) if m.role == "assistant"), None)
            if body.tool_calls is not None:
                calls = [ToolCall.model_validate(c.model_dump()) for c in body.tool_calls]
            else:
                calls = list(last.tool_calls or []) if last is not None else []
            result = await session.env.step(Action(text=last.content if last else "", tool_calls=calls))
            session.turn_rewards.append(float(result.reward))
            session.env_done = session.env_done or result.done
        return StepAnswer(
            messages=[_tool_message(m) for m in result.observations], reward=result.reward, done=result.done
        )

    @app.post("/v1/horizon/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> dict[str, Any]:
        body: RewardRequest = await _json_body(request, RewardRequest)
        session = service.sessions.get(session_id)
        if session.closed:
            raise APIError(409, f"session {session_id!r} already has a reward", code="session_closed")
        session.reward, session.reward_metrics, session.closed = body.reward, body.metrics, True
        return {"session_id": session_id, "reward": body.reward, "closed": True}

    def loads() -> WeightSwaps:
        if weight_swaps is None:
            raise APIError(404, "this server cannot load policies", type="not_found_error", code="not_found")
        return weight_swaps

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body: LoadLoraAdapterRequest = await _json_body(request, LoadLoraAdapterRequest)
        path = loads().allowed_path(
            body.lora_path, token_required=bool(token), what="LoRA adapter loads", param="lora_path"
        )
        await service.loras.load(body.lora_name, body.lora_path, path, inplace=body.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body: UnloadLoraAdapterRequest = await _json_body(request, UnloadLoraAdapterRequest)
        loads().check_token(bool(token), "LoRA adapter unloads", "lora_name")
        await service.loras.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/v1/horizon/weights")
    async def weights(request: Request) -> dict[str, Any]:
        body: WeightsRequest = await _json_body(request, WeightsRequest)
        swaps = loads()
        path = swaps.allowed_path(body.checkpoint, token_required=bool(token))
        t0 = time.perf_counter()
        update = await swaps.load(body.checkpoint, path)
        load_s = time.perf_counter() - t0
        record = await service.swap_weights(update)
        return {
            "policy_version": record.version,
            "load_s": round(load_s, 3),
            "paused_s": round(record.paused_s, 4),
            "update_s": round(record.update_s, 4),
        }

    return app


def _tool_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


async def _stream_response(request: Request, chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events of ``chunks``. The first chunk is taken before answering, so a bad request
    is an error answer and not a broken stream; a client that disconnects stops the stream (and the
    generation behind it) at once, not at the next write (which a server may accept silently)."""
    first = await chunks.__anext__()

    async def events() -> AsyncIterator[str]:
        watcher = asyncio.ensure_future(client_left(request))
        following: asyncio.Future[Any] | None = None
        try:
            yield f"data: {json.dumps(first)}\n\n"
            while True:
                following = asyncio.ensure_future(chunks.__anext__())
                done, _ = await asyncio.wait({following, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if following not in done:  # the client left
                    following.cancel()
                    with contextlib.suppress(BaseException):
                        await following
                    return
                try:
                    item = following.result()
                except StopAsyncIteration:
                    break
                yield f"data: {json.dumps(item)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if following is not None and not following.done():
                # the response itself was cancelled (the server saw the client leave first) while a
                # chunk was being read: cancelling that read ends the generator where it waits (the
                # engine drops the rows, the session's lock is let go); closing it now would fail,
                # as it is still running
                following.cancel()
            else:
                await chunks.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
