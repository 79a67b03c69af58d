"""Settings validation, and the docs that must say what the code does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import CloseCode, ErrorCode
from app.settings import Settings, SettingsError, load_settings, render_docs

ROOT = Path(__file__).resolve().parent.parent


def _table_after(marker: str, text: str) -> list[list[str]]:
    """Rows (cells stripped) of the Markdown table right after ``marker``."""
    rows = []
    for line in text.split(marker, 1)[1].strip().splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[2:]  # header and separator


def test_configuration_doc_matches_settings() -> None:
    """docs/configuration.md carries exactly the generated settings table."""
    doc = (ROOT / "docs/configuration.md").read_text()
    assert doc == render_docs(doc), "run `make docs-config`"
    documented = set(re.findall(r"`(CHAT_[A-Z0-9_]+)`", doc))
    assert {f"CHAT_{name.upper()}" for name in Settings.model_fields} <= documented


def test_protocol_doc_close_codes_match() -> None:
    """The close-code table lists every CloseCode with the right reconnect advice."""
    rows = _table_after("<!-- close-codes -->", (ROOT / "docs/protocol.md").read_text())
    documented = {int(row[0]): row[3] for row in rows}
    assert set(documented) == {int(code) for code in CloseCode}
    for code in CloseCode:
        advice = documented[int(code)]
        says_reconnect = "reconnect" in advice and not advice.startswith("not ")
        assert says_reconnect == code.should_reconnect, (code, advice)


def test_protocol_doc_error_codes_match() -> None:
    """The error-code table lists exactly the ErrorCode values."""
    rows = _table_after("<!-- error-codes -->", (ROOT / "docs/protocol.md").read_text())
    assert {row[0].strip("`") for row in rows} == {code.value for code in ErrorCode}


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CHAT_HEARTBEAT_INTERVAL_S": "-1"}, "CHAT_HEARTBEAT_INTERVAL_S"),
        ({"CHAT_MAX_CONNECTIONS": "many"}, "CHAT_MAX_CONNECTIONS"),
        ({"CHAT_LOG_LEVEL": "loud"}, "CHAT_LOG_LEVEL"),
        ({"CHAT_WS_PER_MESSAGE_DEFLATE": "perhaps"}, "CHAT_WS_PER_MESSAGE_DEFLATE"),
        ({"CHAT_HEARTBEAT_TIMEOUT_S": "30"}, "CHAT_HEARTBEAT_TIMEOUT_S"),
    ],
)
def test_bad_setting_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    """A bad environment value fails with a message naming the variable."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=named):
        load_settings()


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """CHAT_* variables override the defaults."""
    monkeypatch.setenv("CHAT_MAX_TEXT_CHARS", "123")
    monkeypatch.setenv("CHAT_WS_PER_MESSAGE_DEFLATE", "true")
    monkeypatch.setenv("CHAT_AUTH_MODE", "guest")
    settings = load_settings()
    assert settings.max_text_chars == 123 and settings.ws_per_message_deflate
    assert settings.auth_mode == "guest"


def test_server_refuses_to_start_with_bad_setting() -> None:
    """`python -m app` exits 2 and names the variable when a setting is bad."""
    env = {**os.environ, "CHAT_MAX_FRAME_BYTES": "0", "CHAT_PORT": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "CHAT_MAX_FRAME_BYTES" in result.stderr


def test_js_client_reconnects_exactly_when_the_close_code_table_says() -> None:
    """The JavaScript SDK (and the page's bundle of it) must not reconnect after the codes the
    server marks as terminal, and must after every other one."""
    source = (ROOT / "clients" / "js" / "src" / "frames.ts").read_text()
    match = re.search(r"TERMINAL_CLOSE_CODES\b[^=]*= new Set\(\[([\d, ]+)\]\)", source)
    assert match
    terminal = {int(code) for code in match.group(1).split(",")}
    assert terminal == {code for code in CloseCode if not code.should_reconnect}


def test_every_test_the_security_table_names_exists() -> None:
    """docs/security.md's "Attacks and what stops them" names, per row, the test that fails if
    the defence goes: each must exist, or the table promises what nothing checks."""
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## Attacks and what stops them", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section)
    assert len(named) >= 20
    for path, name in named:
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), f"{path}::{name}"
