"""The README stays true to the code: its test command is the one .ci/run runs, its Limits table
lists every ``limits:`` field with its default, its error-code table every ``ErrorCode`` with its
HTTP status, and every ``#anchor`` link names a heading."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.kernel.errors import ErrorCode
from gateway.kernel.settings import Limits

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PROSE = re.sub(r"```.*?```", "", README, flags=re.S)  # headings and links outside code blocks


def section(title: str, text: str = PROSE) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ran = re.search(r"^(python3 -m venv .*?pytest -q -p no:cacheprovider)", ci, re.M)
    assert ran is not None
    command = ran.group(1)
    assert f"```sh\n{command}\n```" in section("Two commands", README)


def test_limits_table_lists_every_limit_field_and_its_default() -> None:
    rows = dict(re.findall(r"^\| `([\w.<>]+)` \| ([^|]+) \|", section("Limits"), re.M))
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
    endpoints = section("Endpoints")
    table = endpoints[endpoints.index("\n### Error codes\n") :]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", table, re.M)
    assert len(rows) == len({code for code, _ in rows}), "a code listed twice"
    assert dict(rows) == {code.value: str(code.status) for code in ErrorCode}


def test_every_anchor_link_names_a_heading() -> None:
    anchors = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", PROSE, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", PROSE)
    assert links
    assert [link for link in links if link not in anchors] == []
