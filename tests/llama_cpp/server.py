"""llama.cpp's ``llama-server`` on a loopback port, serving SmolLM2-135M-Instruct, and the gateway's routes.

``LlamaServer`` starts the binary that ``provision.py`` built (``--jinja``, 2 slots of ``SLOT_CONTEXT``
tokens, 2 threads, no web UI), waits for ``/health``, and stops it; ``busy_slots()`` reads ``/slots``
(which slots are generating: how a test sees that a cancelled request stopped upstream too).
``gateway_settings(port)`` routes one model per adapter to it: ``smol-chat`` (openai-chat, ``/v1``),
``smol-responses`` (openai-responses, ``/v1``) and ``smol-anthropic`` (anthropic, the origin); each
also as ``<model>-wide``, configured with a larger context window than the server has, and
``smol-pair``, two deployments (openai-chat) of the one server.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tests.harness import free_port
from tests.llama_cpp import provision

SLOTS = 2
SLOT_CONTEXT = 4096
ROUTES = {
    "smol-chat": ("llama-chat", "openai-chat", "/v1"),
    "smol-responses": ("llama-responses", "openai-responses", "/v1"),
    "smol-anthropic": ("llama-anthropic", "anthropic", ""),
}


class LlamaServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> LlamaServer:
        argv = [
            str(provision.ensure_server()),
            *("-m", str(provision.ensure_model())),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("-c", str(SLOTS * SLOT_CONTEXT), "-np", str(SLOTS), "-t", "2"),
            "--jinja",
            "--no-webui",
            "--metrics",
        ]
        self._proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited at start-up:\n{self.log_tail()}")
            try:
                if httpx.get(self.origin + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._log.close()

    def log_tail(self, size: int = 4000) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-size:]

    def busy_slots(self) -> int:
        slots = httpx.get(self.origin + "/slots", timeout=5).json()
        return sum(1 for slot in slots if slot.get("is_processing"))

    def last_sampling(self) -> dict[str, Any]:
        """The sampling parameters the server applied to the last task it ran (``/slots``)."""
        slots = httpx.get(self.origin + "/slots", timeout=5).json()
        latest = max(slots, key=lambda slot: slot.get("id_task", -1))
        return dict(latest["params"])

    def log_count(self, text: str) -> int:
        """How many times the server's log says ``text`` (it logs each error it answers)."""
        return self.log_tail(size=10**9).count(text)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def gateway_settings(server: LlamaServer, **extra: Any) -> dict[str, Any]:
    providers = {
        name: {"kind": kind, "base_url": server.origin + path, "api_key": "sk-llama"}
        for name, kind, path in ROUTES.values()
    }
    providers["llama-chat-b"] = providers["llama-chat"]
    models: dict[str, Any] = {
        model: {"provider": name, "upstream_model": "smollm2", "context_window": SLOT_CONTEXT}
        for model, (name, _, _) in ROUTES.items()
    }
    # the same routes with a context window the server does not have: what the upstream says of an
    # overflow, not the gateway's own estimate, decides
    for model, (name, _, _) in ROUTES.items():
        models[f"{model}-wide"] = {
            "provider": name,
            "upstream_model": "smollm2",
            "context_window": 8 * SLOT_CONTEXT,
        }
    # two deployments of one model (the same server twice): what a failure ejects
    models["smol-pair"] = {
        "deployments": [{"provider": "llama-chat"}, {"provider": "llama-chat-b"}],
        "upstream_model": "smollm2",
        "context_window": SLOT_CONTEXT,
    }
    return {"providers": providers, "models": models, **extra}
