"""Reading the normalized transcript's content the way several request builders need it: data
URLs, the error for a part a provider cannot take, an assistant message's texts, and a call's
arguments as an object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, UpstreamRejected

if TYPE_CHECKING:
    from adapters.base import UpstreamRequest

__all__ = [
    "LOGPROBS_INCLUDE",
    "arguments_object",
    "assistant_texts",
    "native_stop",
    "parse_data_url",
    "unsupported_content",
]

LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the include that asks for token logprobs
# The sampling parameters whose spec default (1.0) the response states: sent at that value unless
# the provider's own default is the same (ProviderSettings.sends_default_sampling)
DEFAULT_ONE = frozenset({"temperature", "top_p"})


def unsupported_content(kind: Any) -> UpstreamRejected:
    """The error for a content part type the provider cannot take."""
    return UpstreamRejected(
        f"This model's provider does not accept '{kind}' content.", code=ErrorCode.UNSUPPORTED_CONTENT
    )


def parse_data_url(url: str, default_mime: str) -> tuple[str, str]:
    """(media type, base64 data) of a ``data:`` URL; only base64 data URLs are accepted."""
    head, sep, data = url.partition(",")
    if not sep or ";base64" not in head:
        raise UpstreamRejected("A data URL must be base64-encoded.", code=ErrorCode.INVALID_IMAGE_URL)
    return head[5:].split(";")[0] or default_mime, data


def arguments_object(arguments: str | None) -> dict[str, Any]:
    """A call's JSON arguments as an object (APIs that take parsed arguments need one): ``{}``
    when they do not parse, ``{"value": ...}`` around a non-object, so what the model said is kept."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {"value": args}


def assistant_texts(content: Any) -> Iterator[str]:
    """The non-empty texts of an assistant message's parts (a refusal counts as text)."""
    for part in content or []:
        text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if text:
            yield text


def native_stop(req: UpstreamRequest) -> list[str]:
    """The stop sequences of a Chat Completions client (``stop``: a string or up to four) or a
    Messages client (``stop_sequences``), as a list: what the adapters of other APIs send as their
    own (empty: none, or an Open Responses request)."""
    native = req.native
    if native is None or native.api is ClientApi.RESPONSES:
        return []
    stop = native.fields.get("stop" if native.api is ClientApi.CHAT else "stop_sequences")
    if isinstance(stop, str):
        return [stop] if stop else []
    return [s for s in stop if isinstance(s, str) and s] if isinstance(stop, list) else []
