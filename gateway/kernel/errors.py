"""The one error tree, and its renderings.

    class                            status  type                   code
    GatewayError                      500    server_error           server_error
    ├── ServerError                   500    server_error           server_error
    ├── InvalidRequest                400    invalid_request_error  invalid_request_error
    │   ├── ModelNotFound             400    invalid_request_error  model_not_found (param "model")
    │   ├── PreviousResponseNotFound  400    invalid_request_error  previous_response_not_found
    │   │                                                           (param "previous_response_id")
    │   ├── ContextLengthExceeded     400    invalid_request_error  context_length_exceeded
    │   ├── InvalidEncryptedContent   400    invalid_request_error  invalid_encrypted_content
    │   ├── ConnectionLimitReached    400    invalid_request_error  websocket_connection_limit_reached
    │   └── PayloadTooLarge           413    invalid_request_error  payload_too_large
    ├── AuthenticationFailed          401    authentication_error   invalid_api_key
    ├── PermissionDenied              403    permission_error       permission_denied (an admin
    │                                                               key off /v1/usage, another
    │                                                               tenant's usage)
    ├── NotFound                      404    not_found              not_found
    ├── RateLimited                   429    too_many_requests      rate_limit_exceeded (retry_after)
    │   └── QuotaExceeded             429    too_many_requests      insufficient_quota (a budget)
    ├── ServiceUnavailable            503    server_error           service_unavailable (e.g. the
    │                                                               state store is down)
    ├── McpServerError                424    server_error           mcp_server_error (a request's
    │                                                               MCP server cannot be listed)
    └── UpstreamError                 502    server_error           upstream_error (retryable or not)
        ├── UpstreamTimeout           504    server_error           upstream_timeout
        ├── UpstreamConnectError      502    server_error           upstream_connect_error
        ├── UpstreamRateLimited       429    too_many_requests      rate_limit_exceeded
        ├── UpstreamRejected          400    invalid_request_error  upstream_invalid_request
        └── IllegalTransition         502    server_error           upstream_protocol_error

Codes are one enumeration, ``ErrorCode`` (each with its HTTP status: a class's status is its
code's). ``chain_too_deep()`` makes an InvalidRequest (param "previous_response_id"). Any ``code``
can be overridden per instance (``UpstreamError(..., code=ErrorCode.EVENT_LIMIT_EXCEEDED)``; the
instance then answers that code's status); an upstream's own code (a ``str`` an adapter read from
an error body) keeps the class's status.

The three renderings of an error: ``http_body()``, the JSON body of an HTTP error reply;
``stream_event(n)``, the ``error`` event (sequence number ``n``) a response stream sends before
``response.failed``; ``ws_envelope()``, the WebSocket ``error`` message for a request that gets no
response (refused before generation, dropped, connection limit), with the HTTP status and a code
that is never null. Besides, ``response_error()`` is the ``{code, message}`` of a failed
ResponseResource.

Upstream failures are translated into this tree inside the adapters; nothing upstream-raw
(URLs, keys, bodies) is ever put into a message: only the provider's reason, scrubbed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Every error code the gateway itself answers, with the HTTP status it answers it with (the
    error-code table of docs/errors.md and the metrics' ``error_code`` label set are made from this). A
    ``GatewayError`` given one of these takes its status; a code an upstream named (a plain
    ``str``, adapters/upstream_errors.py) keeps the status of the class it is raised with.

    To add a code: a member here (``NAME = "wire_string", status``), a row in docs/errors.md's
    "Error codes" table, and raise it as ``SomeError(..., code=ErrorCode.NAME)``."""

    status: int

    def __new__(cls, value: str, status: int) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        return member

    # the tree's own (the classes below)
    SERVER_ERROR = "server_error", 500
    INVALID_REQUEST_ERROR = "invalid_request_error", 400
    MODEL_NOT_FOUND = "model_not_found", 400
    PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found", 400
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded", 400
    INVALID_ENCRYPTED_CONTENT = "invalid_encrypted_content", 400
    WEBSOCKET_CONNECTION_LIMIT_REACHED = "websocket_connection_limit_reached", 400
    PAYLOAD_TOO_LARGE = "payload_too_large", 413
    INVALID_API_KEY = "invalid_api_key", 401
    PERMISSION_DENIED = "permission_denied", 403
    NOT_FOUND = "not_found", 404
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded", 429
    INSUFFICIENT_QUOTA = "insufficient_quota", 429
    SERVICE_UNAVAILABLE = "service_unavailable", 503
    UPSTREAM_ERROR = "upstream_error", 502
    UPSTREAM_TIMEOUT = "upstream_timeout", 504
    UPSTREAM_CONNECT_ERROR = "upstream_connect_error", 502
    UPSTREAM_INVALID_REQUEST = "upstream_invalid_request", 400
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error", 502
    # a request the gateway refuses
    INVALID_JSON = "invalid_json", 400
    INVALID_VALUE = "invalid_value", 400
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter", 400
    UNKNOWN_PARAMETER = "unknown_parameter", 400
    UNSUPPORTED_PARAMETER = "unsupported_parameter", 400
    TOO_MANY_INPUT_ITEMS = "too_many_input_items", 400
    NESTING_TOO_DEEP = "nesting_too_deep", 400
    DUPLICATE_CALL_ID = "duplicate_call_id", 400
    INVALID_FUNCTION_CALL_OUTPUT = "invalid_function_call_output", 400
    ITEM_NOT_FOUND = "item_not_found", 400
    STORE_NOT_ALLOWED = "store_not_allowed", 400
    INVALID_CONFIG = "invalid_config", 400
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    REQUEST_TIMEOUT = "request_timeout", 408
    REQUEST_HEADERS_TOO_LARGE = "request_headers_too_large", 431
    # the WebSocket's
    UNSUPPORTED_FRAME_TYPE = "unsupported_frame_type", 400
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type", 400
    WEBSOCKET_LANE_LIMIT = "websocket_lane_limit", 429
    WEBSOCKET_QUEUE_FULL = "websocket_queue_full", 429
    BACKGROUND_QUEUE_FULL = "background_queue_full", 429
    # content a provider cannot take (found before the upstream call)
    UNSUPPORTED_CONTENT = "unsupported_content", 400
    INVALID_IMAGE_URL = "invalid_image_url", 400
    INVALID_FILE_DATA = "invalid_file_data", 400
    # the upstream's failures, as the gateway names them
    UPSTREAM_AUTH_ERROR = "upstream_auth_error", 502
    UPSTREAM_QUOTA_EXCEEDED = "upstream_quota_exceeded", 429
    MALFORMED_FUNCTION_CALL = "malformed_function_call", 502
    EVENT_LIMIT_EXCEEDED = "event_limit_exceeded", 502
    EMPTY_SUMMARY = "empty_summary", 502
    # hosted tools (MCP servers)
    MCP_SERVER_ERROR = "mcp_server_error", 424
    MCP_SERVER_NOT_ALLOWED = "mcp_server_not_allowed", 400


class GatewayError(Exception):
    """The root. A subclass names its ``code``; its ``status`` is the code's (``ErrorCode``)."""

    status: int = ErrorCode.SERVER_ERROR.status
    type: str = "server_error"
    code: str | None = ErrorCode.SERVER_ERROR

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if isinstance(code, ErrorCode):
            cls.status = code.status

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
            if isinstance(code, ErrorCode):
                self.status = code.status

    def error_object(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code, "message": self.message, "param": self.param}

    # -- renderings -------------------------------------------------------------------------
    def http_body(self) -> dict[str, Any]:
        return {"error": self.error_object()}

    def stream_event(self, sequence_number: int) -> dict[str, Any]:
        """The SSE ``error`` event. The top-level duplicates are what real clients read."""
        err = self.error_object()
        return {
            "type": "error",
            "sequence_number": sequence_number,
            "code": err["code"],
            "message": err["message"],
            "param": err["param"],
            "error": err,
        }

    def ws_envelope(self) -> dict[str, Any]:
        err = self.error_object()
        if err["code"] is None:
            err["code"] = self.type
        return {"type": "error", "status": self.status, "error": err}

    def response_error(self) -> dict[str, str]:
        """The ``{code, message}`` put on a failed ResponseResource."""
        return {"code": self.code or self.type, "message": self.message}


class ServerError(GatewayError):
    """An unexpected failure inside the gateway (500 server_error)."""


class InvalidRequest(GatewayError):
    type = "invalid_request_error"
    code = ErrorCode.INVALID_REQUEST_ERROR


class ModelNotFound(InvalidRequest):
    code = ErrorCode.MODEL_NOT_FOUND

    def __init__(self, model: str) -> None:
        super().__init__(f"The requested model '{model}' does not exist.", param="model")


class PreviousResponseNotFound(InvalidRequest):
    code = ErrorCode.PREVIOUS_RESPONSE_NOT_FOUND

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"Previous response with id '{response_id}' not found.", param="previous_response_id"
        )


def chain_too_deep(max_depth: int) -> InvalidRequest:
    return InvalidRequest(
        f"The previous_response_id chain is longer than {max_depth} responses.",
        param="previous_response_id",
    )


class ContextLengthExceeded(InvalidRequest):
    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED


class InvalidEncryptedContent(InvalidRequest):
    code = ErrorCode.INVALID_ENCRYPTED_CONTENT


class ConnectionLimitReached(InvalidRequest):
    code = ErrorCode.WEBSOCKET_CONNECTION_LIMIT_REACHED


class AuthenticationFailed(GatewayError):
    type = "authentication_error"
    code = ErrorCode.INVALID_API_KEY


class PermissionDenied(GatewayError):
    type = "permission_error"
    code = ErrorCode.PERMISSION_DENIED


class NotFound(GatewayError):
    type = "not_found"
    code = ErrorCode.NOT_FOUND


class PayloadTooLarge(InvalidRequest):
    code = ErrorCode.PAYLOAD_TOO_LARGE


@dataclass(frozen=True, slots=True)
class RateWindow:
    """One per-minute dimension (requests or tokens) of a gateway limit: the limit with the least
    left (the key's or the tenant's), what is left of it and when its window resets."""

    limit: int
    remaining: int
    reset_ms: int


@dataclass(frozen=True, slots=True)
class RateStanding:
    """Where a request stands against its per-minute limits (the transport writes it as the
    ``x-ratelimit-*`` headers); None for a dimension no limit applies to."""

    requests: RateWindow | None
    tokens: RateWindow | None


class RateLimited(GatewayError):
    type = "too_many_requests"
    code = ErrorCode.RATE_LIMIT_EXCEEDED

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        standing: RateStanding | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.standing = standing  # a gateway limit's figures (the reply's x-ratelimit-* headers)


class QuotaExceeded(RateLimited):
    """A tenant's token budget is spent for its period."""

    code = ErrorCode.INSUFFICIENT_QUOTA


class ServiceUnavailable(GatewayError):
    type = "server_error"
    code = ErrorCode.SERVICE_UNAVAILABLE


class McpServerError(GatewayError):
    """An MCP server a request names could not be listed (refused address, connection failure,
    timeout, HTTP error, malformed JSON-RPC): the request fails before anything is generated.
    The message names the server by its label, never its URL, headers or what it answered."""

    type = "server_error"
    code = ErrorCode.MCP_SERVER_ERROR


class UpstreamError(GatewayError):
    """The provider failed. ``retryable`` marks transient failures, worth a retry or a fallback
    model when no output has reached the client yet, and held against the deployment's health
    (429, 5xx, timeouts, connection errors: adapters/upstream_errors.py decides). ``reason``: the
    provider's own message, scrubbed (adapters/upstream_errors.py ``scrub_reason``), for the log.
    A context overflow (code ``context_length_exceeded``) carries what the provider reported, when
    it did: ``prompt_tokens``, the request's size in its tokens, and ``context_limit``, the most
    its prompt may take (its window, less the completion's share when it counts one)."""

    type = "server_error"
    code = ErrorCode.UPSTREAM_ERROR

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        upstream_status: int | None = None,
        prompt_tokens: int | None = None,
        context_limit: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.retryable = retryable
        self.retry_after = retry_after
        self.upstream_status = upstream_status
        self.prompt_tokens = prompt_tokens
        self.context_limit = context_limit
        self.reason: str | None = None


class UpstreamTimeout(UpstreamError):
    code = ErrorCode.UPSTREAM_TIMEOUT


class UpstreamConnectError(UpstreamError):
    code = ErrorCode.UPSTREAM_CONNECT_ERROR


class UpstreamRateLimited(UpstreamError):
    """The provider said 429: shown to the client as 429 too_many_requests."""

    type = "too_many_requests"
    code = ErrorCode.RATE_LIMIT_EXCEEDED


class UpstreamRejected(UpstreamError):
    """The provider refused the request as invalid (its 400/404/422): the client can fix it."""

    type = "invalid_request_error"
    code = ErrorCode.UPSTREAM_INVALID_REQUEST


class IllegalTransition(UpstreamError):
    """The delta sequence broke a state machine of the ResponseBuilder (an adapter or upstream bug)."""

    code = ErrorCode.UPSTREAM_PROTOCOL_ERROR
