"""gateway/kernel/estimate.py against real token counts: each sample's count is what llama.cpp's
``/tokenize`` (llama-server, SmolLM2-135M's tokenizer) answered for it, hard-coded here; the
estimate must stay within a bounded ratio of it (docs/compaction.md has the table)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from gateway.kernel.estimate import ITEM_OVERHEAD, estimate_bytes, estimate_item, estimate_text

ENGLISH = (
    "A gateway sits between its clients and the model providers. It authenticates every request, "
    "routes it to a deployment, assembles the conversation from what the store keeps, and relays "
    "the answer back as it is generated. When a provider fails before the first token, the gateway "
    "retries elsewhere; when the context is too long for the model, it drops the oldest turns, "
    "keeping each function call with its output, or refuses the request with a clear error."
)
DIGITS = str(7**4000)
CODE = '''def fit(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Drop the oldest items until the rest fit in ``limit`` tokens."""
    sizes = [estimate_item(i) for i in items]
    total = sum(sizes)
    kept = list(items)
    while kept and total > limit:
        total -= sizes[len(items) - len(kept)]
        kept.pop(0)
    if total > limit:
        raise ContextLengthExceeded(f"about {total} tokens, more than {limit}")
    return kept
'''
JSON = json.dumps(
    [
        {"id": n, "name": f"item_{n}", "price": n * 37 % 1000 / 10, "tags": ["new", "sale"][: n % 3]}
        for n in range(40)
    ]
)
CJK = (
    "人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"
    "该领域的研究包括机器人、语言识别、图像识别、自然语言处理和专家系统等。自诞生以来，理论和技术日益成熟，应用领域也不断扩大。"
)
CYRILLIC = (
    "Шлюз стоит между клиентами и поставщиками моделей. Он проверяет каждый запрос, выбирает "
    "развёртывание, собирает беседу из того, что хранится, и передаёт ответ по мере его создания."
)
BASE64 = base64.b64encode(b"".join(hashlib.sha256(bytes([n])).digest() for n in range(60))).decode()

# (sample, tokens llama-server's /tokenize counted, the least and the most estimate/count allowed)
MEASURED = [
    pytest.param(ENGLISH, 91, 1.0, 1.3, id="english"),
    pytest.param(DIGITS, 3381, 0.95, 1.05, id="digits"),
    pytest.param(CODE, 132, 0.9, 1.2, id="code"),
    pytest.param(JSON, 1267, 0.9, 1.1, id="json"),
    pytest.param(CJK, 197, 0.7, 1.1, id="cjk"),
    pytest.param(CYRILLIC, 138, 0.9, 1.25, id="cyrillic"),
    pytest.param(BASE64, 2071, 0.65, 1.0, id="base64"),
]


@pytest.mark.parametrize(("text", "counted", "low", "high"), MEASURED)
def test_the_estimate_is_within_bounds_of_real_counts(
    text: str, counted: int, low: float, high: float
) -> None:
    ratio = estimate_text(text) / counted
    assert low <= ratio <= high, f"{estimate_text(text)} estimated for {counted} counted ({ratio:.2f})"
    assert estimate_bytes(text.encode()) == estimate_text(text)


def test_fixed_expectations() -> None:
    assert estimate_text(None) == 0 and estimate_text("") == 0
    assert estimate_text("abcd") == 1 and estimate_text("abcde") == 2  # lowercase: 4 letters a token
    assert estimate_text("1" * 18_029) == 18_029  # a run of digits: one token each (was 4,508)
    assert estimate_text("日本語") == 4  # 5/4 a character
    assert estimate_text("Жж") == 2  # 1 a 2-byte character
    assert estimate_text("{}[]") == 3  # punctuation 3/4
    assert estimate_text("😀😀") == 4  # 2 a 4-byte character
    assert estimate_text("a" + " " * 40) == 5  # whitespace 1/10
    assert estimate_text("\ud800") == 2  # a lone surrogate (3 bytes) does not raise


def test_an_items_strings_are_weighed_together_ids_not() -> None:
    item = {
        "type": "message",
        "id": "msg_" + "Z" * 400,
        "role": "user",
        "content": [{"type": "input_text", "text": "7" * 10}],
    }
    assert estimate_item(item) == 10 + ITEM_OVERHEAD
