"""The context-overflow error bodies of each provider, as they send them (with HTTP 400): what
adapters/upstream_errors.py must recognise as ``context_length_exceeded``, with the counts they
report. llama.cpp's is llama-server's own answer (``exceed_context_size_error``)."""

from __future__ import annotations

from typing import Any

__all__ = ["ANTHROPIC", "GEMINI", "LLAMA_CPP", "OPENAI_CHAT", "OPENAI_RESPONSES", "VLLM", "VLLM_NEW"]

LLAMA_CPP: dict[str, Any] = {
    "error": {
        "code": 400,
        "message": "request (10030 tokens) exceeds the available context size (1024 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 10030,
        "n_ctx": 1024,
    }
}
OPENAI_CHAT: dict[str, Any] = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted "
        "in 130532 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
OPENAI_RESPONSES: dict[str, Any] = {
    "error": {
        "message": "Your input exceeds the context window of this model. Please adjust your input "
        "and try again.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC: dict[str, Any] = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 208310 tokens > 200000 maximum",
    },
}
GEMINI: dict[str, Any] = {
    "error": {
        "code": 400,
        "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        "status": "INVALID_ARGUMENT",
    }
}
VLLM: dict[str, Any] = {
    "object": "error",
    "message": "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens "
    "(2900 in the messages, 100 in the completion). Please reduce the length of the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
# vLLM >= 0.10, when max_tokens leaves no room
VLLM_NEW: dict[str, Any] = {
    "object": "error",
    "message": "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context "
    "length is 2048 tokens and your request has 2000 input tokens (100 > 2048 - 2000).",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
