"""The error codes are one enumeration: every class of the error tree answers with its code's HTTP
status, a code given to an instance brings its status, an upstream's own code keeps the class's,
and the wire strings are plain JSON strings."""

from __future__ import annotations

import orjson

from gateway.kernel import errors
from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest, RateLimited, UpstreamRejected


def _tree(cls: type[GatewayError]) -> list[type[GatewayError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _tree(child))]


def test_every_class_answers_with_its_codes_status() -> None:
    classes = [c for c in _tree(GatewayError) if c.__module__ == errors.__name__]
    assert len(classes) >= 19
    for cls in classes:
        assert isinstance(cls.code, ErrorCode), cls
        assert cls.status == cls.code.status, cls


def test_a_code_given_to_an_instance_brings_its_status() -> None:
    assert InvalidRequest("x", code=ErrorCode.METHOD_NOT_ALLOWED).status == 405
    assert InvalidRequest("x", code=ErrorCode.REQUEST_HEADERS_TOO_LARGE).status == 431
    assert RateLimited("x", code=ErrorCode.WEBSOCKET_LANE_LIMIT).status == 429
    upstream = UpstreamRejected("x", code="invalid_api_key")  # an upstream's word, not the gateway's
    assert upstream.status == 400 and upstream.code == "invalid_api_key"


def test_the_wire_strings_are_unchanged() -> None:
    err = InvalidRequest("x", code=ErrorCode.INVALID_JSON, param="p")
    assert orjson.loads(orjson.dumps(err.http_body())) == {
        "error": {"type": "invalid_request_error", "code": "invalid_json", "message": "x", "param": "p"}
    }
    assert ErrorCode.WEBSOCKET_LANE_LIMIT.value == "websocket_lane_limit"
    assert f"{ErrorCode.INVALID_API_KEY}" == "invalid_api_key"
    assert len({c.value for c in ErrorCode}) == len(ErrorCode)
