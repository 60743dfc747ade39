"""deploy/Dockerfile and .dockerignore, checked without a Docker engine: the image installs from the
pinned constraints, every runtime dependency (and what it pulls in) is pinned, it runs as a non-root
uid, and the build context holds what the Dockerfile copies and nothing like a venv, .git or a .env."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"not an exact pin: {line}"
            out[canonicalize_name(name)] = version.strip()
    return out


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_the_image_installs_from_the_pinned_constraints() -> None:
    steps = instructions()
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    copies = [args for w, args in final if w == "COPY"]
    target = next(a.split()[-1] for a in copies if a.split()[0] == "deploy/constraints.txt")
    runs = " && ".join(args for w, args in final if w == "RUN")
    assert f"pip install -r {target}" in runs  # the pinned dependencies, in their own layer
    assert re.search(rf"pip install -c {re.escape(target)} \S+\.whl", runs)  # the gateway, held to them
    assert "pip check" in runs
    assert not re.search(r"pip install(?! -[rc] )(?! \"setuptools)", runs.replace("--no-cache-dir ", ""))


def test_every_runtime_dependency_is_pinned_within_its_bounds() -> None:
    pinned = pins()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, (
            f"{req.name}: no pin in deploy/constraints.txt (python deploy/freeze_constraints.py)"
        )
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
    assert not {"pytest", "ruff", "mypy", "hypothesis", "helm-python-sdk"} & set(pinned)  # runtime only


def test_what_the_dependencies_pull_in_is_pinned_too() -> None:
    """The freeze script's closure over this environment names nothing the file lacks (names only:
    this environment's versions may be newer than the image's pins)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "freeze_constraints.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    needed = {canonicalize_name(line.split("==")[0]) for line in out.stdout.splitlines() if "==" in line}
    assert needed - set(pins()) == set(), (
        "regenerate: python deploy/freeze_constraints.py > deploy/constraints.txt"
    )


def test_the_image_runs_as_a_non_root_uid() -> None:
    users = [args for w, args in instructions() if w == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) >= 1000
    # the chart's runAsUser is that uid (runAsNonRoot can only verify a numeric USER)
    chart = (
        ROOT / "deploy" / "helm" / "open-responses-gateway" / "templates" / "deployment.yaml"
    ).read_text()
    assert f"runAsUser: {users[-1].split(':')[0]}" in chart
    entry = next(args for w, args in instructions() if w == "ENTRYPOINT")
    assert entry == '["openresponses-gateway"]'


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) in order, as Docker reads .dockerignore: the last matching rule wins,
    and a rule matching a directory matches what is in it."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((not negate, re.compile(regex + "$")))
    return rules


def in_context(path: str) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for excludes, regex in dockerignore_rules():
        if any(regex.match(p) for p in prefixes):
            included = not excludes
    return included


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/test_packaging.py",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/gateway/cli.data.json",
        ".ruff_cache/content",
        ".hypothesis/examples/x",
        "bench/results/run.json",
        "deploy/.env",
        ".env",
        "gateway/__pycache__/cli.cpython-311.pyc",
        "openresponses_gateway.egg-info/PKG-INFO",
        ".test-redis/dump.rdb",
    ],
)
def test_the_build_context_leaves_out(path: str) -> None:
    assert not in_context(path)


def test_the_build_context_holds_everything_the_dockerfile_copies() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = tracked.split()
    copied = [args.split()[:-1] for w, args in instructions() if w == "COPY" and "--from" not in args]
    sources = [s for srcs in copied for s in srcs]
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pkg in packages["include"]:  # every package the wheel includes is copied
        assert pkg.rstrip("*") in sources, pkg
    for src in sources:
        under = [f for f in files if f == src or f.startswith(src + "/")]
        assert under, f"COPY {src}: not in the repository"
        assert all(in_context(f) for f in under if "__pycache__" not in f), src
