"""A fake OpenAI Responses API upstream (``POST /v1/responses``, streamed): a real HTTP server on
loopback that speaks the event stream the API reference documents (``response.created`` ...
``response.completed``, with upstream ids and sequence numbers the gateway must not leak).

    async with FakeOpenAIResponses.serve() as fake:
        fake.add(Reply.tool_calls([("get_weather", '{"city":"Paris"}', "call_1")]))
        settings = ProviderSettings(kind="openai-responses", base_url=fake.base_url, api_key="sk-test")

Like the real API with ``store: false``, it refuses a reasoning item without ``encrypted_content``
and a ``function_call_output`` whose call is not in the input. ``python -m
tests.fakes.openai_responses --port 9101`` serves it standalone with the default policy.
"""

from __future__ import annotations

import os
from typing import Any

from tests.fakes.scripted import Ask, Event, Reject, Reply, ScriptedFake, pieces, run_main

__all__ = ["FakeOpenAIResponses", "Reply"]

_ERRORS = {
    "rate_limit": ("rate_limit_exceeded", "requests"),
    "overloaded": ("server_error", "server_error"),
    "server": ("server_error", "server_error"),
    "invalid": ("invalid_prompt", "invalid_request_error"),
    "auth": ("invalid_api_key", "invalid_request_error"),
    "not_found": ("model_not_found", "invalid_request_error"),
}
_PART_TYPES = {
    "user": {"input_text", "input_image", "input_file", "input_video"},
    "system": {"input_text"},
    "developer": {"input_text"},
    "assistant": {"output_text", "refusal"},
}


class FakeOpenAIResponses(ScriptedFake):
    """A fake Responses API server (base URL ends with ``/v1``)."""

    base_path = "/v1"

    def route(self, method: str, path: str, query: str) -> str | None:
        return "" if method == "POST" and path == "/v1/responses" else None

    def check(self, headers: dict[str, str], body: Any) -> None:
        if not headers.get("authorization", "").startswith("Bearer "):
            raise Reject(401, "You didn't provide an API key.", "auth")
        if not isinstance(body.get("model"), str):
            raise Reject(400, "Missing required parameter: 'model'.")
        items = body.get("input")
        if isinstance(items, str):
            return
        if not isinstance(items, list):
            raise Reject(400, "Invalid type for 'input'.")
        calls: set[str] = set()
        for n, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in _PART_TYPES:
                    raise Reject(400, f"Invalid value for 'input[{n}].role'.")
                content = item.get("content")
                if isinstance(content, list):
                    for part in content:
                        if part.get("type") not in _PART_TYPES[role]:
                            raise Reject(400, f"Invalid content type in 'input[{n}]'.")
            elif kind == "function_call":
                calls.add(item["call_id"])
            elif kind == "function_call_output":
                if item.get("call_id") not in calls:
                    raise Reject(
                        400,
                        f"No tool call found for function call output with call_id {item.get('call_id')}.",
                    )
            elif kind == "reasoning":
                if not item.get("encrypted_content"):
                    raise Reject(
                        400,
                        f"Item with id '{item.get('id')}' not found. "
                        "Items are not persisted when `store` is false.",
                    )
            else:
                raise Reject(400, f"Invalid value for 'input[{n}].type'.")

    def ask(self, body: dict[str, Any]) -> Ask:
        raw = body.get("input") or []
        items: list[Any] = (
            [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
        )
        ask = Ask(max_tokens=body.get("max_output_tokens"), reasoning=bool(body.get("reasoning")))
        for item in items:
            if item.get("type", "message") == "message" and item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, str):
                    ask.user_text = content
                else:
                    ask.user_text = " ".join(
                        p.get("text", "") for p in content if p.get("type") == "input_text"
                    )
                    ask.images += sum(1 for p in content if p.get("type") == "input_image")
        last = items[-1] if items else {}
        if last.get("type") == "function_call_output":
            out = last.get("output")
            ask.tool_result = out if isinstance(out, str) else " ".join(p.get("text", "") for p in out or [])
        ask.tools = [
            (t["name"], t.get("parameters")) for t in body.get("tools") or [] if t.get("type") == "function"
        ]
        choice = body.get("tool_choice", "auto")
        if isinstance(choice, dict):
            if choice.get("type") == "function":
                ask.forced, ask.mode = choice.get("name"), "required"
            elif choice.get("type") == "allowed_tools":
                names = {t.get("name") for t in choice.get("tools") or []}
                ask.tools = [t for t in ask.tools if t[0] in names]
                ask.mode = choice.get("mode") or "auto"
        else:
            ask.mode = choice
        return ask

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        code, etype = _ERRORS.get(kind, ("server_error", "server_error"))
        return {"error": {"message": message, "type": etype, "param": None, "code": code}}

    def render(self, reply: Reply, body: dict[str, Any], model: str) -> list[Event]:
        return _Renderer(reply, body).events()


class _Renderer:
    """One reply as the Responses event stream."""

    def __init__(self, reply: Reply, body: dict[str, Any]) -> None:
        self.reply = reply
        self.body = body
        self.seq = 0
        self.out: list[Event] = []
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] = {
            "id": f"resp_{os.urandom(8).hex()}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "in_progress",
            "model": body.get("model"),
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
            "store": body.get("store", True),
        }

    def emit(self, kind: str, **fields: Any) -> None:
        self.out.append((kind, {"type": kind, "sequence_number": self.seq, **fields}))
        self.seq += 1

    def events(self) -> list[Event]:
        r = self.reply
        self.emit("response.created", response=dict(self.response))
        self.emit("response.in_progress", response=dict(self.response))
        if r.reasoning is not None or r.signature is not None:
            self.reasoning_item()
        if r.answer:
            self.message_item()
        for name, args, call_id in r.calls:
            self.call_item(name, args, call_id)
        if r.stream_error:
            code, _ = _ERRORS.get(r.stream_error, ("server_error", ""))
            failed = {**self.response, "status": "failed", "output": self.output}
            failed["error"] = {"code": code, "message": "The model failed to generate a response."}
            self.emit("response.failed", response=failed)
            return self.out
        if not r.terminal:
            return self.out
        final = {**self.response, "output": self.output, "usage": self.usage()}
        if r.finish_reason == "length":
            final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
            self.emit("response.incomplete", response=final)
        elif r.finish_reason == "content_filter":
            final.update(status="incomplete", incomplete_details={"reason": "content_filter"})
            self.emit("response.incomplete", response=final)
        else:
            final["status"] = "completed"
            self.emit("response.completed", response=final)
        return self.out

    def usage(self) -> dict[str, Any] | None:
        r = self.reply
        if r.usage is None:
            return None
        return {
            "input_tokens": r.usage[0],
            "input_tokens_details": {"cached_tokens": r.cached},
            "output_tokens": r.usage[1],
            "output_tokens_details": {"reasoning_tokens": r.reasoning_tokens},
            "total_tokens": r.usage[0] + r.usage[1],
        }

    def reasoning_item(self) -> None:
        r = self.reply
        oi = len(self.output)
        item: dict[str, Any] = {"id": f"rs_{os.urandom(8).hex()}", "type": "reasoning", "summary": []}
        self.emit("response.output_item.added", output_index=oi, item=dict(item))
        if r.reasoning:
            part = {"type": "summary_text", "text": ""}
            common = {"item_id": item["id"], "output_index": oi, "summary_index": 0}
            self.emit("response.reasoning_summary_part.added", **common, part=part)
            for piece in pieces(r.reasoning, r.pieces):
                self.emit("response.reasoning_summary_text.delta", **common, delta=piece)
            self.emit("response.reasoning_summary_text.done", **common, text=r.reasoning)
            self.emit("response.reasoning_summary_part.done", **common, part={**part, "text": r.reasoning})
            item["summary"] = [{"type": "summary_text", "text": r.reasoning}]
        if r.signature and "reasoning.encrypted_content" in (self.body.get("include") or []):
            item["encrypted_content"] = r.signature
        self.output.append(item)
        self.emit("response.output_item.done", output_index=oi, item=item)

    def message_item(self) -> None:
        r = self.reply
        oi = len(self.output)
        text = r.answer or ""
        item: dict[str, Any] = {
            "id": f"msg_{os.urandom(8).hex()}",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.emit("response.output_item.added", output_index=oi, item=dict(item))
        common = {"item_id": item["id"], "output_index": oi, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        self.emit("response.content_part.added", **common, part=part)
        for piece in pieces(text, r.pieces):
            self.emit("response.output_text.delta", **common, delta=piece, logprobs=[])
        self.emit("response.output_text.done", **common, text=text, logprobs=[])
        self.emit("response.content_part.done", **common, part={**part, "text": text})
        status = "incomplete" if r.finish_reason == "length" and not r.calls else "completed"
        item.update(status=status, content=[{**part, "text": text}])
        self.output.append(item)
        self.emit("response.output_item.done", output_index=oi, item=item)

    def call_item(self, name: str, args: str, call_id: str | None) -> None:
        r = self.reply
        oi = len(self.output)
        item: dict[str, Any] = {
            "id": f"fc_{os.urandom(8).hex()}",
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call_id or f"call_{os.urandom(8).hex()}",
            "name": name,
        }
        self.emit("response.output_item.added", output_index=oi, item=dict(item))
        for piece in pieces(args, r.arg_pieces):
            self.emit(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=oi, delta=piece
            )
        self.emit(
            "response.function_call_arguments.done", item_id=item["id"], output_index=oi, arguments=args
        )
        item.update(status="completed", arguments=args)
        self.output.append(item)
        self.emit("response.output_item.done", output_index=oi, item=item)


if __name__ == "__main__":
    run_main(FakeOpenAIResponses, 9101)
