"""How many tokens a context takes, estimated without a tokenizer (used by truncation, compaction
and the WebSocket connection cache, which keeps each transcript's total so a turn only counts its
new items).

The estimator, and how wrong it can be
--------------------------------------
``estimate_item`` counts the UTF-8 bytes of every string an upstream would tokenize (text, tool
names, arguments and outputs, reasoning text; not ids, types or statuses), divides by 4 and rounds
up, then adds ``ITEM_OVERHEAD`` (4) tokens per item for role/format tokens. Images count a flat
``IMAGE_TOKENS`` (1,000; 85 with ``detail: "low"``) and files a flat ``FILE_TOKENS`` (1,500).

Against BPE tokenizers of the GPT-4o/Claude/Gemini generation this is, roughly:
- English prose: about 4 bytes per token, so within ±15%;
- code, JSON and tool arguments: 3 to 3.5 bytes per token, so it under-counts by 15-30%;
- CJK text: 3 bytes per character and about 1 token per character, so within ±25% (counting
  characters instead of bytes would under-count by ~3x; bytes are why this uses bytes);
- base64, hashes, random identifiers: 2-3 bytes per token, under-counting by up to 2x;
- images vary by provider and size (85 to ~1,600 tokens each); files are unknowable without
  parsing them and may be under-counted by any factor for long documents.
The request's ``instructions`` and tool schemas are not items: the orchestrator counts them
(characters / 4) and passes them to ``fit_context`` as ``reserved``. No room is reserved for the
output. An under-count means the upstream itself refuses the request
(a 400 from the provider, passed on as ``upstream_invalid_request``); an over-count can refuse a
request with ``truncation: "disabled"`` that would just have fit. The estimate is deliberately
unbiased for prose rather than padded, so such false refusals need a context within ~15% of the
window.
"""

from __future__ import annotations

from typing import Any

Item = dict[str, Any]
BYTES_PER_TOKEN = 4
ITEM_OVERHEAD = 4
IMAGE_TOKENS = 1_000
IMAGE_LOW_TOKENS = 85
FILE_TOKENS = 1_500
_SKIPPED_KEYS = frozenset({"id", "type", "status", "call_id", "role", "phase", "detail", "filename"})


def estimate_text(text: str | None) -> int:
    """Tokens of a plain string (ceil of UTF-8 bytes / 4)."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN) if text else 0


def _walk(value: Any) -> tuple[int, int]:
    """(text bytes, fixed-cost tokens) of a JSON-like value."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")), 0
    if isinstance(value, list):
        b = t = 0
        for v in value:
            vb, vt = _walk(v)
            b, t = b + vb, t + vt
        return b, t
    if not isinstance(value, dict):
        return 0, 0
    kind = value.get("type")
    if kind == "input_image":
        return 0, IMAGE_LOW_TOKENS if value.get("detail") == "low" else IMAGE_TOKENS
    if kind == "input_file":
        return 0, FILE_TOKENS
    if kind == "input_video":
        return 0, IMAGE_TOKENS * 10
    b = t = 0
    for key, v in value.items():
        if key not in _SKIPPED_KEYS:
            vb, vt = _walk(v)
            b, t = b + vb, t + vt
    return b, t


def estimate_item(item: Item) -> int:
    """Estimated tokens of one normalized item (see the module docstring for the error)."""
    text_bytes, fixed = _walk(item)
    return -(-text_bytes // BYTES_PER_TOKEN) + fixed + ITEM_OVERHEAD


def estimate(items: list[Item]) -> int:
    return sum(estimate_item(i) for i in items)
