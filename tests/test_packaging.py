"""What an install gets: every third-party module the gateway imports is a declared dependency, and
the license the metadata names is shipped."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "adapters", "state", "compact")


def project() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["project"]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(PACKAGES) - set(sys.stdlib_module_names)


def test_every_imported_distribution_is_declared() -> None:
    deps: list[str] = project()["dependencies"]  # type: ignore[assignment]
    declared = {normalized(re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0]) for dep in deps}
    owners = importlib.metadata.packages_distributions()
    missing = {}
    for module in imported_modules():
        dists = owners.get(module, [module])
        if not declared & {normalized(d) for d in dists}:
            missing[module] = dists
    assert not missing, f"imported but not in [project] dependencies: {missing}"


def test_the_license_named_in_the_metadata_is_shipped() -> None:
    assert project()["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "9. Accepting Warranty or Additional Liability." in text


def test_the_wheel_ships_the_consoles_assets(tmp_path: Path) -> None:
    """The console (gateway/api/console) is served from files in the package: the wheel has them."""
    import subprocess
    import zipfile

    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in ("console.js", "console.css"):
        assert f"gateway/api/console/static/{asset}" in names
