"""Every fake upstream at once, plus a gateway config that routes a model through each adapter:

    python -m tests.fakes.all --config /tmp/fakes.yaml          # serves until interrupted
    python -m gateway serve --config /tmp/fakes.yaml --port 8080

Models ``via-openai-chat``, ``via-openai-responses``, ``via-anthropic`` and ``via-gemini`` then reach
the fakes in their own wire formats (``mock`` is listed, so it stays served beside them): what the
official compliance suite or a client SDK needs to exercise every adapter without a paid provider.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.fakes.openai_responses import FakeOpenAIResponses
from tests.fakes.server import serve_asgi

KINDS: dict[str, Any] = {
    "openai-chat": FakeOpenAIChat,
    "openai-responses": FakeOpenAIResponses,
    "anthropic": FakeAnthropic,
    "gemini": FakeGemini,
}


def gateway_config(base_urls: dict[str, str]) -> dict[str, Any]:
    return {
        "providers": {
            f"fake-{kind}": {"kind": kind, "base_url": url, "api_key": "sk-fake"}
            for kind, url in base_urls.items()
        },
        "models": {
            **{
                f"via-{kind}": {"provider": f"fake-{kind}", "upstream_model": "fake-model"}
                for kind in base_urls
            },
            "mock": {"provider": "mock"},  # the built-in model is served beside providers only if listed
        },
    }


async def serve(config: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for kind, cls in KINDS.items():
            fake = cls()
            if isinstance(fake, FakeOpenAIChat):
                fake.responder = smart_reply
            fake.server = await stack.enter_async_context(serve_asgi(fake))
            urls[kind] = fake.base_url
        await asyncio.to_thread(config.write_text, yaml.safe_dump(gateway_config(urls), sort_keys=False))
        for kind, url in urls.items():
            print(f"{kind:<17} {url}", flush=True)
        print(f"gateway config: {config}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, required=True, help="where to write the gateway config")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.config))


if __name__ == "__main__":
    main()
