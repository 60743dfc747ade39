"""A provider's config can only say what the upstream request line and head can carry: its base URL
(valid URL characters, http or https, no credentials, query or fragment), its key (visible ASCII)
and its extra headers (token names, values without control characters, none the client writes
itself). Every refusal names the provider and field and never repeats the secret."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.kernel.settings import ConfigError, load_settings

SECRET = "SECRET-0123456789"


def refusal(provider: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(providers={"up": {"kind": "openai-chat", **provider}})
    text = str(caught.value)
    assert SECRET not in text, text
    return text


@pytest.mark.parametrize(
    ("provider", "field", "says"),
    [
        ({"base_url": "http://h.example/v1 /x"}, "base_url", "a character a URL cannot"),
        ({"base_url": "http://h.example/v1\x00"}, "base_url", "a character a URL cannot"),
        ({"base_url": "http://h.example/%zz"}, "base_url", "a % not followed by two hex digits"),
        ({"base_url": "http://h.exämple/v1"}, "base_url", "a character a URL cannot"),
        ({"base_url": "file:///etc/passwd"}, "base_url", "http://"),
        ({"base_url": f"https://u:{SECRET}@h.example/v1"}, "base_url", "credentials"),
        ({"base_url": f"https://h.example/v1?key={SECRET}"}, "base_url", "query"),
        ({"base_url": "https://h.example/v1#"}, "base_url", "fragment"),
        ({"api_key": f"{SECRET}\n"}, "api_key", "a header cannot carry"),
        ({"api_key": f"{SECRET}\x00"}, "api_key", "a header cannot carry"),
        ({"api_key": f"sk {SECRET}"}, "api_key", "a header cannot carry"),
        ({"api_key": f"{SECRET}é"}, "api_key", "a header cannot carry"),
        ({"headers": {"Host": "attacker.example"}}, "headers.Host", "writes this header itself"),
        ({"headers": {"Content-Length": "0"}}, "headers.Content-Length", "writes this header itself"),
        ({"headers": {"connection": "close"}}, "headers.connection", "writes this header itself"),
        ({"headers": {"Keep-Alive": "timeout=5"}}, "headers.Keep-Alive", "writes this header itself"),
        ({"headers": {"Upgrade": "h2c"}}, "headers.Upgrade", "writes this header itself"),
        ({"headers": {"TE": "trailers"}}, "headers.TE", "writes this header itself"),
        ({"headers": {"x-a:b": "1"}}, "headers", "not a header name"),
        ({"headers": {"x-a\r\nHost": "1"}}, "headers", "not a header name"),
        ({"headers": {"": "1"}}, "headers", "not a header name"),
        ({"headers": {"x-key": f"{SECRET}\r\nHost: evil"}}, "headers.x-key", "the value holds a control"),
        ({"headers": {"x-key": f"{SECRET}\x7f"}}, "headers.x-key", "the value holds a control"),
        ({"headers": {"x-key": f"{SECRET}ü"}}, "headers.x-key", "non-ASCII"),
        ({"headers": {"x-key": f" {SECRET}"}}, "headers.x-key", "whitespace"),
        ({"anthropic_version": "2023-06-01\r\nx-evil: 1"}, "anthropic_version", "the value holds a control"),
    ],
)
def test_a_provider_field_the_request_cannot_carry_is_refused(
    provider: dict[str, Any], field: str, says: str
) -> None:
    text = refusal(provider)
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"providers.up.{field}: ")), None)
    assert line is not None, text
    assert says in line, text


def test_what_real_providers_use_is_accepted() -> None:
    settings = load_settings(
        providers={
            "up": {
                "kind": "openai-chat",
                "base_url": "https://my-resource.openai.azure.com/openai/deployments/gpt-4o%2Dmini/v1",
                "api_key": "sk-proj-AbC_dEf-123~.+/=",
                "headers": {
                    "OpenAI-Organization": "org-123",
                    "anthropic-beta": "prompt-caching-2024-07-31, pdfs-2024-09-25",
                    "X-Tab": "a\tb",
                    "x-empty": "",
                    "Content-Type": "application/json; charset=utf-8",
                },
            },
            "ipv6": {"kind": "openai-chat", "base_url": "http://[::1]:8000/v1"},
        }
    )
    assert settings.providers["up"].headers["x-empty"] == ""
    assert settings.providers["ipv6"].resolved_base_url() == "http://[::1]:8000/v1"
