"""The README and the docs stay true to the code: the README's test command is the one .ci/run runs
and its config example is one ``check-config`` accepts; docs/limits.md lists every ``limits:`` field
with its default, docs/errors.md every ``ErrorCode`` with its HTTP status; every link between the
README and the docs pages names a file and a heading that exist, and every page is in the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.kernel.errors import ErrorCode
from gateway.kernel.settings import Limits, McpSettings
from tests.api.helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def prose(text: str) -> str:
    """Headings, tables and links outside code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def page(name: str) -> str:
    return prose((DOCS / name).read_text(encoding="utf-8"))


def section(title: str, text: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens (MkDocs
    makes the same one for every heading these pages have; `mkdocs build --strict` checks its own)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ran = re.search(r"^(python3 -m venv .*?pytest -q -p no:cacheprovider)", ci, re.M)
    assert ran is not None
    command = ran.group(1)
    assert f"```sh\n{command}\n```" in section("Two commands", README)


def test_readme_config_example_is_accepted_by_check_config(tmp_path: Path) -> None:
    example = re.search(r"```yaml\n(.*?)```", section("A provider behind it", README), re.S)
    assert example is not None
    config = tmp_path / "gateway.yaml"
    config.write_text(example.group(1), encoding="utf-8")
    out = run_cli("check-config", "--config", str(config), env=cli_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "configuration ok"
    commands = section("A provider behind it", README)
    assert "python -m gateway check-config --config gateway.yaml" in commands
    assert "python -m gateway serve --config gateway.yaml" in commands


def test_limits_table_lists_every_limit_field_and_its_default() -> None:
    rows = dict(re.findall(r"^\| `([\w.<>]+)` \| ([^|]+) \|", page("limits.md"), re.M))
    assert set(Limits.model_fields) <= set(rows), set(Limits.model_fields) - set(rows)
    assert "providers.<name>.merge_deltas" in rows
    for name, field in Limits.model_fields.items():
        shown = rows[name].strip()
        default = field.default
        if isinstance(default, int) and not isinstance(default, bool) and default % (1024 * 1024) == 0:
            assert shown in (str(default), f"{default // (1024 * 1024)} MiB"), name
        elif isinstance(default, float) and default.is_integer():
            assert shown == str(int(default)), name
        else:
            assert shown == str(default), name


def test_error_code_table_lists_exactly_the_codes_and_their_statuses() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", page("errors.md"), re.M)
    assert len(rows) == len({code for code, _ in rows}), "a code listed twice"
    assert dict(rows) == {code.value: str(code.status) for code in ErrorCode}


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(path.read_text(encoding="utf-8")), re.M)}


def broken_links(path: Path) -> tuple[int, list[str]]:
    """How many local links ``path`` has, and those whose file or ``#anchor`` does not exist."""
    links = re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text(encoding="utf-8")))
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    broken = []
    for link in local:
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.is_file() or (anchor and anchor not in anchors(file)):
            broken.append(link)
    return len(local), broken


def test_every_link_names_a_file_and_a_heading() -> None:
    counts = {}
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        counts[path.name], broken = broken_links(path)
        assert broken == [], (path.name, broken)
    assert counts.pop("README.md") and sum(counts.values()), counts


def test_readme_links_every_docs_page_and_the_nav_lists_every_page() -> None:
    pages = {path.name for path in DOCS.glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", prose(README)))
    assert pages - {"index.md"} <= linked, pages - linked

    def listed(nav: object) -> set[str]:
        """The pages a nav entry lists: a page, a titled entry, or a list of entries."""
        if isinstance(nav, str):
            return {nav}
        items = list(nav.values()) if isinstance(nav, dict) else nav
        assert isinstance(items, list), nav
        return set().union(*(listed(item) for item in items))

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert site["docs_dir"] == "docs"
    assert listed(site["nav"]) == pages


def test_mcp_limits_table_lists_every_bound_and_its_default() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", page("mcp.md"), re.M))
    bounds = {n: f for n, f in McpSettings.model_fields.items() if n not in ("allow", "servers")}
    assert set(bounds) <= set(rows), set(bounds) - set(rows)
    for name, field in bounds.items():
        default = field.default
        shown = str(int(default)) if isinstance(default, float) and default.is_integer() else str(default)
        assert rows[name].strip() == shown, name
