"""Reading the config (gateway/kernel/settings/loading.py): the file's path goes to its settings
source, not through the environment, so loads at once (a reload beside a check, two apps in one
process) each read their own file; ``--config`` over ``GATEWAY_CONFIG``, the environment over the
file, the arguments over both."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.kernel.settings import load_settings


def _config(tmp_path: Path, name: str, body_bytes: int) -> str:
    path = tmp_path / name
    path.write_text(f"limits: {{max_body_bytes: {body_bytes}}}\n")
    return str(path)


def test_loads_at_once_each_read_their_own_file(tmp_path: Path) -> None:
    files = {n: _config(tmp_path, f"{n}.yaml", n) for n in (2048, 4096, 8192)}
    before = dict(os.environ)

    def load(n: int) -> list[int]:
        return [load_settings(files[n]).limits.max_body_bytes for _ in range(30)]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave within a load, as a busy process's would
    try:
        with ThreadPoolExecutor(len(files)) as pool:
            read = dict(zip(files, pool.map(load, files), strict=True))
    finally:
        sys.setswitchinterval(interval)
    assert read == {n: [n] * 30 for n in files}
    assert dict(os.environ) == before  # loading wrote nothing to the environment


def test_the_path_the_variable_and_the_overrides_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given, named = _config(tmp_path, "given.yaml", 2048), _config(tmp_path, "named.yaml", 4096)
    monkeypatch.setenv("GATEWAY_CONFIG", named)
    assert load_settings().limits.max_body_bytes == 4096  # GATEWAY_CONFIG without --config
    assert load_settings(given).limits.max_body_bytes == 2048  # --config wins
    monkeypatch.setenv("GATEWAY_LIMITS__MAX_BODY_BYTES", "3072")
    assert load_settings(given).limits.max_body_bytes == 3072  # the environment over the file
    assert load_settings(given, limits={"max_body_bytes": 5120}).limits.max_body_bytes == 5120
