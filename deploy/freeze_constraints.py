"""Print pins (name==version) for the gateway's runtime dependencies and everything they pull in,
as installed in this environment: the image installs with them as constraints (pip install -c).

    python deploy/freeze_constraints.py > deploy/constraints.txt

Only [project] dependencies are followed (extras they name included; markers evaluated for this
interpreter, which should be the image's: Linux, CPython 3.11), never the test extras."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """canonical name -> installed version, for ``roots`` and what they require, transitively."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r, frozenset[str]()) for r in roots]
    while todo:
        req, parent_extras = todo.pop()
        env = [{"extra": e} for e in parent_extras] or [{"extra": ""}]
        if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
            continue
        name = canonicalize_name(req.name)
        extras = frozenset(req.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            sys.exit(f"{name} is required but not installed here: install the gateway first")
        pins[name] = dist.version
        todo.extend((Requirement(r), extras) for r in dist.requires or ())
    return pins


def main() -> None:
    pins = closure(runtime_requirements())
    print("# The gateway's runtime dependencies, pinned (python deploy/freeze_constraints.py).")
    print(f"# Python {sys.version_info.major}.{sys.version_info.minor} on {sys.platform}; no test tools.")
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")


if __name__ == "__main__":
    main()
