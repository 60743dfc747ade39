"""How many tokens a context takes, estimated without a tokenizer (used by truncation, compaction
and the WebSocket connection cache, which keeps each transcript's total so a turn only counts its
new items).

The estimator, and how wrong it can be
--------------------------------------
``estimate_item`` weighs every character of every string an upstream would tokenize (text, tool
names, arguments and outputs, reasoning text; not ids, types or statuses) by its kind, sums, rounds
up, then adds ``ITEM_OVERHEAD`` (4) tokens per item for role/format tokens. Images count a flat
``IMAGE_TOKENS`` (1,000; 85 with ``detail: "low"``) and files a flat ``FILE_TOKENS`` (1,500).

The weights, in tokens per character (``_units``): a lowercase ASCII letter 1/4, an uppercase one
3/4 (mixed case is what identifiers, base64 and hashes are made of), a digit 1 (Llama-family and
SmolLM tokenizers split numbers into single digits; GPT's take up to three per token, so this is
the high side), ASCII punctuation 3/4 (JSON and code are mostly punctuation, rarely merged),
whitespace 1/10 (a space merges into the next word), a 2-byte UTF-8 character (Cyrillic, Greek,
Arabic, Hebrew, accented Latin) 1, a 3-byte one (CJK, kana, Hangul, Indic, Thai) 5/4, a 4-byte one
(emoji, rare CJK) 2. One ``bytes.translate`` into character classes and a ``count`` per class: no
per-character Python loop (about 0.4 ms for 100 KB).

Measured against llama.cpp's ``/tokenize`` (SmolLM2's 49k BPE vocabulary, a small one: the large
vocabularies of GPT-4o, Claude and Gemini give fewer tokens for the same text, so against them the
estimate is higher), with the former estimate (UTF-8 bytes / 4) for comparison (the table of
docs/compaction.md, kept in tests/kernel/test_estimate.py):
- English prose: about +20% (the former estimate: +25%);
- digits: exact for a Llama-style tokenizer, up to 3x high for GPT's (the former: 4x low);
- code and JSON: within ±5% (the former: 15% low for code, 2x low for JSON);
- CJK: about 25% low (the former: 2x low); Cyrillic: about +15% (the former: 40% low);
- base64, hashes, random identifiers: about 30% low (the former: 3x low);
- images vary by provider and size (85 to ~1,600 tokens each); files are unknowable without
  parsing them and may be under-counted by any factor for long documents.
The request's ``instructions`` and tool schemas are not items: the orchestrator estimates them
(``estimate_text``) and passes them to ``fit_context`` as ``reserved``. No room is reserved for the
output. An under-count means the upstream itself refuses the request: passed on as
``context_length_exceeded``, or with ``truncation: "auto"`` retried once, cut by the count the
upstream reported (gateway/engine/turn.py); an over-count can refuse a request with ``truncation:
"disabled"`` that would just have fit.
"""

from __future__ import annotations

from typing import Any

Item = dict[str, Any]
ITEM_OVERHEAD = 4
IMAGE_TOKENS = 1_000
IMAGE_LOW_TOKENS = 85
FILE_TOKENS = 1_500
_SKIPPED_KEYS = frozenset({"id", "type", "status", "call_id", "role", "phase", "detail", "filename"})

# Every UTF-8 byte -> the class of the character it starts (a continuation byte: none, "c"); the
# classes of equal weight share a letter, so ``_units`` counts six: l 5, U (uppercase, punctuation)
# 15, d (digit, a 2-byte character) 20, s 2, 3 25, 4 40.
_UNIT = 20  # weights are in 1/20 tokens, so sums stay integers


def _class(byte: int) -> bytes:
    char = chr(byte)
    if byte >= 0xF0:
        return b"4"
    if byte >= 0xE0:
        return b"3"
    if byte >= 0xC0:
        return b"d"
    if byte >= 0x80:
        return b"c"
    if char.isdigit():
        return b"d"
    if char.isupper():
        return b"U"
    if char.isalpha():
        return b"l"
    if char.isspace() or byte < 0x20 or byte == 0x7F:
        return b"s"
    return b"U"


_CLASSES = b"".join(_class(b) for b in range(256))


def _units(data: bytes) -> int:
    """The weight, in 1/``_UNIT`` tokens, of UTF-8 text."""
    if not data:
        return 0
    c = data.translate(_CLASSES)  # then six C-level counts, no Python loop: this runs on every turn
    return (
        5 * c.count(b"l")
        + 15 * c.count(b"U")
        + 20 * c.count(b"d")
        + 2 * c.count(b"s")
        + 25 * c.count(b"3")
        + 40 * c.count(b"4")
    )


def estimate_bytes(data: bytes) -> int:
    """Tokens of UTF-8 text (JSON too: tool schemas are counted as they are sent)."""
    return -(-_units(data) // _UNIT)


def estimate_text(text: str | None) -> int:
    """Tokens of a plain string."""
    return -(-_units(text.encode("utf-8", "surrogatepass")) // _UNIT) if text else 0


def _walk(value: Any) -> tuple[int, int]:
    """(text weight in 1/``_UNIT`` tokens, fixed-cost tokens) of a JSON-like value."""
    if isinstance(value, str):
        return _units(value.encode("utf-8", "surrogatepass")), 0
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
    units, fixed = _walk(item)
    return -(-units // _UNIT) + fixed + ITEM_OVERHEAD


def estimate(items: list[Item]) -> int:
    return sum(estimate_item(i) for i in items)
