"""Pure request translation: a normalized ``UpstreamRequest`` → a Gemini ``generateContent`` body.

Gemini has no call ids, so ``functionResponse`` parts are named after the transcript's
``function_call`` with the same ``call_id``. A reasoning item's ``encrypted_content`` is a
``thoughtSignature``; it goes back on the next part of the same model turn (the function call it
came with), as the API requires for function calling with thinking models.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import quote

import orjson

from adapters.base import UpstreamRequest
from adapters.content import (
    LOGPROBS_INCLUDE,
    arguments_object,
    assistant_texts,
    native_stop,
    parse_data_url,
    unsupported_content,
)
from adapters.gemini.schema import to_gemini_schema
from adapters.gemini.wire import (
    GeminiContent,
    GeminiFunctionCall,
    GeminiFunctionCallingConfig,
    GeminiFunctionDeclaration,
    GeminiGenerationConfig,
    GeminiPart,
    GeminiRequest,
    GeminiSamplingKey,
    GeminiThinkingConfig,
    GeminiTool,
)
from adapters.tools import function_tools
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, UpstreamRejected
from gateway.kernel.tool_choice import parse_tool_choice

__all__ = ["build_body", "build_contents", "build_tools", "model_path"]

_COLLECTIONS = frozenset({"models", "tunedModels"})
_EFFORT_BUDGET = {"none": 0, "minimal": 0, "low": 1024, "medium": 8192, "high": 24576, "xhigh": 32768}
_MIME_BY_EXT = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "heic": "image/heic",
    "pdf": "application/pdf",
    "txt": "text/plain",
}
_SAMPLING: tuple[tuple[str, GeminiSamplingKey], ...] = (
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)


def model_path(model: str) -> str:
    """``models/{model}``, the name one escaped path segment (``/``, ``:``, ``?``, ``#``, ``%`` and
    the rest of what would steer the request encoded); a name already naming one of the API's
    collections (``models/x``, ``tunedModels/x``) keeps that prefix, the rest escaped."""
    collection, sep, name = model.partition("/")
    if not (sep and collection in _COLLECTIONS):
        collection, name = "models", model
    return f"{collection}/{quote(name, safe='')}"


def build_body(req: UpstreamRequest) -> GeminiRequest:
    """The body for ``req``: the same for ``:streamGenerateContent`` and, when ``req.stream`` is
    False, ``:generateContent`` (the URL alone says whether the reply streams)."""
    system, contents = build_contents(req)
    body: GeminiRequest = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    tools, config = build_tools(req)
    if tools:
        body["tools"] = tools
        if config is not None:
            body["toolConfig"] = {"functionCallingConfig": config}
    generation = _generation_config(req)
    native = req.native
    if native is not None and native.api is ClientApi.MESSAGES:  # what Gemini expresses of a Messages request
        if isinstance(native.fields.get("top_k"), int):
            generation["topK"] = native.fields["top_k"]  # type: ignore[typeddict-unknown-key]
    if generation:
        body["generationConfig"] = generation
    return body


def _generation_config(req: UpstreamRequest) -> GeminiGenerationConfig:
    out: GeminiGenerationConfig = {}
    if req.max_output_tokens is not None:
        out["maxOutputTokens"] = req.max_output_tokens
    for ours, theirs in _SAMPLING:
        value = getattr(req, ours)
        if value is not None:
            out[theirs] = value
    fmt = req.text_format or {}
    if fmt.get("type") in ("json_object", "json_schema"):
        out["responseMimeType"] = "application/json"
        if fmt.get("type") == "json_schema" and fmt.get("schema"):
            out["responseSchema"] = to_gemini_schema(fmt["schema"])
    reasoning = req.reasoning or {}
    thinking: GeminiThinkingConfig = {}
    if reasoning.get("effort") in _EFFORT_BUDGET:
        thinking["thinkingBudget"] = _EFFORT_BUDGET[reasoning["effort"]]
    if reasoning.get("summary"):
        thinking["includeThoughts"] = True
    if thinking:
        out["thinkingConfig"] = thinking
    if req.top_logprobs is not None or LOGPROBS_INCLUDE in req.include:
        out["responseLogprobs"] = True
        if req.top_logprobs:
            out["logprobs"] = req.top_logprobs
    stop = native_stop(req)
    if stop:
        out["stopSequences"] = stop
    seed = (
        req.native.fields.get("seed") if req.native is not None and req.native.api is ClientApi.CHAT else None
    )
    if type(seed) is int:
        out["seed"] = seed
    return out


# -- contents ---------------------------------------------------------------------------------
class _Contents:
    """Accumulates ``contents`` with merged same-role turns and pending thought signatures."""

    def __init__(self) -> None:
        self.turns: list[GeminiContent] = []
        self.signature: str | None = None  # from a reasoning item, for the next model part

    def add(self, role: Literal["user", "model"], parts: list[GeminiPart]) -> None:
        if not parts:
            return
        if role == "model" and self.signature is not None:
            parts[0]["thoughtSignature"] = self.signature
            self.signature = None
        elif role != "model":
            self.flush_signature()
        if self.turns and self.turns[-1]["role"] == role:
            self.turns[-1]["parts"].extend(parts)
        else:
            self.turns.append({"role": role, "parts": parts})

    def flush_signature(self) -> None:
        """A signature with no later model part goes on the model turn's last part."""
        if self.signature is not None and self.turns and self.turns[-1]["role"] == "model":
            self.turns[-1]["parts"][-1].setdefault("thoughtSignature", self.signature)
        self.signature = None


def build_contents(req: UpstreamRequest) -> tuple[str, list[GeminiContent]]:
    """(system instruction text, ``contents`` with roles user/model)."""
    system: list[str] = [req.instructions] if req.instructions else []
    names = {i["call_id"]: i["name"] for i in req.items if i.get("type") == "function_call"}
    acc = _Contents()
    for item in req.items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role in ("system", "developer"):
                text = "\n".join(p.get("text") or "" for p in item.get("content") or [])
                if text:
                    system.append(text)
            elif role == "assistant":
                acc.add("model", _model_parts(item.get("content")))
            else:
                acc.add("user", _user_parts(item.get("content")))
        elif kind == "function_call":
            call: GeminiFunctionCall = {"name": item["name"], "args": arguments_object(item.get("arguments"))}
            acc.add("model", [{"functionCall": call}])
        elif kind == "function_call_output":
            acc.add("user", _function_response(item, names.get(item["call_id"], item["call_id"])))
        elif kind == "reasoning" and item.get("encrypted_content"):
            acc.flush_signature()
            acc.signature = item["encrypted_content"]
    acc.flush_signature()
    return "\n\n".join(system), acc.turns


def _model_parts(content: Any) -> list[GeminiPart]:
    return [{"text": text} for text in assistant_texts(content)]


def _user_parts(content: Any) -> list[GeminiPart]:
    parts: list[GeminiPart] = []
    for part in content or []:
        kind = part.get("type")
        if kind in ("input_text", "text", "output_text"):
            if part.get("text"):
                parts.append({"text": part["text"]})
        elif kind == "input_image":
            parts.append(_media(part.get("image_url"), None, "image/jpeg"))
        elif kind == "input_file":
            data = part.get("file_data")
            if data and not data.startswith("data:"):
                mime = _mime_of(part.get("filename"), "application/pdf")
                parts.append({"inlineData": {"mimeType": mime, "data": data}})
            else:
                parts.append(_media(data or part.get("file_url"), part.get("filename"), "application/pdf"))
        elif kind == "input_video":
            parts.append(_media(part.get("video_url"), None, "video/mp4"))
        else:
            raise unsupported_content(kind)
    return parts


def _media(url: str | None, filename: str | None, default_mime: str) -> GeminiPart:
    if url and url.startswith("data:"):
        mime, data = parse_data_url(url, default_mime)
        return {"inlineData": {"mimeType": mime, "data": data}}
    if url and url.startswith(("http://", "https://", "gs://")):
        mime = _mime_of(filename or url.split("?")[0], default_mime)
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise UpstreamRejected(
        "This model's provider needs media as a URL or a data URL.", code=ErrorCode.UNSUPPORTED_CONTENT
    )


def _mime_of(name: str | None, default: str) -> str:
    ext = (name or "").rsplit(".", 1)[-1].lower() if name and "." in name else ""
    return _MIME_BY_EXT.get(ext, default)


def _function_response(item: dict[str, Any], name: str) -> list[GeminiPart]:
    output = item.get("output")
    media: list[GeminiPart] = []
    if output is None or isinstance(output, str):
        text = output or ""
    else:
        text = "\n".join(p.get("text") or "" for p in output if p.get("type") in ("input_text", "text"))
        media = _user_parts([p for p in output if p.get("type") not in ("input_text", "text")])
    try:
        parsed = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        parsed = None
    # The API wants an object; "output" is its documented key for a plain result.
    response = parsed if isinstance(parsed, dict) else {"output": text}
    return [{"functionResponse": {"name": name, "response": response}}, *media]


# -- tools ------------------------------------------------------------------------------------
def build_tools(req: UpstreamRequest) -> tuple[list[GeminiTool], GeminiFunctionCallingConfig | None]:
    """Gemini ``tools`` and ``functionCallingConfig`` (None: omit, i.e. AUTO)."""
    tc = parse_tool_choice(req.tool_choice)
    declarations: list[GeminiFunctionDeclaration] = []
    for tool in function_tools(req.tools, tc.allowed):
        decl: GeminiFunctionDeclaration = {"name": tool["name"]}
        if tool.get("description"):
            decl["description"] = tool["description"]
        params = to_gemini_schema(tool.get("parameters") or {})
        if params.get("properties"):  # the API refuses an OBJECT with no properties
            decl["parameters"] = params
        declarations.append(decl)
    if not declarations:
        return [], None
    tools: list[GeminiTool] = [{"functionDeclarations": declarations}]
    if tc.mode == "none":
        return tools, {"mode": "NONE"}
    if tc.mode == "required":
        config: GeminiFunctionCallingConfig = {"mode": "ANY"}
        if tc.name is not None:
            config["allowedFunctionNames"] = [tc.name]
        return tools, config
    return tools, None
