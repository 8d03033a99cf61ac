"""The OpenAI-compatible wire format of ``horizon serve``: request and response models, and errors.

Requests are validated as OpenAI validates them: a field OpenAI does not know is refused with
``Unrecognized request argument supplied: NAME`` (400), as api.openai.com answers, so a typo never
silently changes what a client gets. Fields OpenAI knows that do not change the sampled tokens
(``user``, ``store``, ``metadata``, ...) are accepted; fields that would change them and are not
implemented here (``frequency_penalty``/``presence_penalty`` other than 0, ``logit_bias``,
``echo``) are refused, naming the field. ``response_format`` (``text``, ``json_object``,
``json_schema``), ``tool_choice`` and vLLM's ``structured_outputs`` are checked here for their
shape, and schemas for their depth (:data:`MAX_SCHEMA_DEPTH`); :mod:`horizonrl.serve.structured`
turns them into the engine's constraint.
Errors have OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from horizonrl.asgi import nesting_depth

# ------------------------------------------------------------------------------------------ errors


class APIError(Exception):
    """An error answered in OpenAI's shape with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def validation_error(exc: ValidationError) -> APIError:
    """One readable 400 for a pydantic error: the first problem, with its field path as ``param``."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body",))
    if first.get("type") == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {loc}", param=loc)
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    return bad_request(f"Invalid value for '{loc}': {message}" if loc else message, param=loc or None)


# ------------------------------------------------------------------------------------------ requests

MAX_SCHEMA_DEPTH = 64
"""How deep a tool's ``parameters``, a ``response_format`` schema or ``structured_outputs.json`` may
nest (JSON arrays and objects inside each other); a deeper one is a 400 naming the field."""


def _too_deep(what: str) -> ValueError:
    return ValueError(
        f"{what} nests JSON more than {MAX_SCHEMA_DEPTH} levels deep; "
        f"schemas of at most {MAX_SCHEMA_DEPTH} levels are accepted"
    )


def check_schema_depth(schema: Any, what: str) -> None:
    """Raise ValueError (one line naming ``what`` and the limit) when ``schema`` nests too deep."""
    if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise _too_deep(what)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_schema_depth(value, "the schema")
        problem = _schema_problem(json.dumps(value, sort_keys=True))
        if problem:
            raise ValueError(problem)
        return value


@functools.lru_cache(maxsize=1024)
def _schema_problem(schema_json: str) -> str | None:
    """What is wrong with a tool's parameter schema (None: nothing). Cached: checking a schema costs
    ~1.8 ms, and agents send the same tools with every request."""
    import jsonschema

    value = json.loads(schema_json)
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"
    if value.get("type", "object") != "object":
        return f"a function's parameters must be a JSON Schema of type 'object', got {value['type']!r}"
    return None


class ToolDef(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionCallIn(_Strict):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessageIn(_Strict):
    """A message of a request (OpenAI's roles; ``developer`` is read as ``system``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    def text(self) -> str:
        """The content as one string (text parts joined); other part types are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        out = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise bad_request(
                    f"content parts of type {part.type!r} are not supported; this server reads 'text' parts",
                    param="messages",
                )
            out.append(part.text)
        return "".join(out)


RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def check_response_format(value: dict[str, Any]) -> None:
    """Raise ValueError (one line) unless ``value`` is one of OpenAI's response formats: ``text``,
    ``json_object``, or ``json_schema`` with ``{name, description?, schema?, strict?}``."""
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise ValueError(f"type must be one of {', '.join(map(repr, RESPONSE_FORMATS))}; got {kind!r}")
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    extra = sorted(set(value) - allowed)
    if extra:
        raise ValueError(f"type {kind!r} takes no {', '.join(map(repr, extra))}")
    if kind != "json_schema":
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("type 'json_schema' needs 'json_schema': {name, schema, strict}")
    unknown = sorted(set(spec) - _JSON_SCHEMA_KEYS)
    if unknown:
        raise ValueError(
            f"json_schema has unknown keys {unknown}; known: {', '.join(sorted(_JSON_SCHEMA_KEYS))}"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError("json_schema.name must be 1-64 letters, digits, '_' or '-'")
    if not isinstance(spec.get("schema", {}), dict):
        raise ValueError("json_schema.schema must be a JSON Schema object")
    check_schema_depth(spec.get("schema", {}), "json_schema.schema")
    if spec.get("strict") not in (None, True, False):
        raise ValueError("json_schema.strict must be true or false")


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: dict[str, str]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _SamplingFields(_Strict):
    """Fields chat and text completions share."""

    model: str
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # known to OpenAI, accepted: they do not change the tokens sampled here
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    #: vLLM's structured outputs (json, json_object, regex, choice, grammar): horizonrl.serve.structured
    structured_outputs: dict[str, Any] | None = None
    # known to OpenAI, refused unless neutral (see _check_neutral)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("structured_outputs")
    @classmethod
    def _structured_outputs_depth(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        schema = (value or {}).get("json")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except RecursionError:
                raise _too_deep("structured_outputs.json") from None
            except ValueError:
                return value  # not JSON: Constraint.from_structured_outputs says so, naming the field
        check_schema_depth(schema, "structured_outputs.json")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def check_neutral(self) -> None:
        """Refuse fields OpenAI knows that would change the output and are not implemented."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise bad_request(f"'{name}' is not supported by this server (only 0)", param=name)
        if self.logit_bias:
            raise bad_request("'logit_bias' is not supported by this server", param="logit_bias")


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    verbosity: str | None = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any, info: ValidationInfo) -> Any:
        names = [t.function.name for t in info.data.get("tools") or []]
        if isinstance(value, NamedToolChoice):
            wanted = value.function.get("name")
            if wanted not in names:
                raise ValueError(f"tool_choice names {wanted!r}, which is not among the tools {names}")
        elif value == "required" and not names:
            raise ValueError("tool_choice 'required' needs at least one tool in 'tools'")
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_response_format(value)
        return value

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        return self

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema ``response_format`` holds the reply to (None: free text)."""
        fmt = self.response_format or {}
        if fmt.get("type") == "json_object":
            return {"type": "object"}
        if fmt.get("type") == "json_schema":
            return fmt["json_schema"].get("schema") or {}
        return None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: a raw prompt (text or token ids), no chat template."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's extensions, for token-in / token-out clients (engine.kind openai)
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False

    def check_neutral(self) -> None:
        super().check_neutral()
        if self.echo:
            raise bad_request("'echo' is not supported by this server", param="echo")
        if self.suffix:
            raise bad_request("'suffix' is not supported by this server", param="suffix")
        if self.best_of not in (None, 1, self.n):
            raise bad_request("'best_of' is not supported by this server", param="best_of")
        if self.stream:
            raise bad_request("streaming is supported for chat completions only", param="stream")

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request (a single prompt, or a batch)."""
        p = self.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        if isinstance(p, list) and not p:
            raise bad_request("'prompt' must not be empty", param="prompt")
        return list(p)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def counted(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        """The usage of a request that read ``prompt_tokens`` and wrote ``completion_tokens``."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class HorizonInfo(BaseModel):
    """What HorizonRL adds to a completion: the session that recorded it, the weights' version, how
    long the engine took (from submitting the request's choices until the last finished) and how
    long the server held the request (from reading its body to the answer being ready)."""

    session_id: str | None
    policy_version: int
    engine_ms: float | None = None
    server_ms: float | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage
    horizon: HorizonInfo


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"]
    token_ids: list[int] | None = None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[TextChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "horizonrl"
    root: str | None = None  # a LoRA adapter's path (vLLM's)
    parent: str | None = None  # a LoRA adapter's base model


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
