"""The pure stream translators and request builders import no HTTP client: nothing they import,
directly or through the project modules those import, is the upstream client (adapters/http1/,
adapters/transport.py), its parser or another HTTP client (package ``__init__`` files aside)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = sorted([*ROOT.glob("adapters/*/stream.py"), *ROOT.glob("adapters/*/request.py")])


def _imported(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def _closure(path: Path) -> set[str]:
    seen: set[str] = set()
    todo = [path]
    while todo:
        for module in _imported(todo.pop()):
            if module in seen:
                continue
            seen.add(module)
            base = ROOT / module.replace(".", "/")
            todo += [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return seen


def test_the_pure_modules_are_found() -> None:
    assert len(PURE) == 8


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_http_client_is_imported(path: Path) -> None:
    clients = {"adapters.http1", "adapters.transport", "httptools", "aiohttp", "httpx", "h11"}
    assert not {m for m in _closure(path) if m in clients or m.split(".")[0] in clients}
