"""Issue 17, findings 10 and 11: the admin token at start-up (one, printed once, reused by `epctl up`;
EPCTL_ADMIN_TOKEN honoured after a restart), configuration that cannot work refused at start, `/docs`
without a third-party origin, a Content-Security-Policy on `/ui`, a self-contained README."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.cli.up import _session_admin_token, admin_token_file
from app.core.config import ConfigError, Settings, load_settings
from app.core.db import make_engine
from app.tokens.models import ApiToken, TokenRole
from app.tokens.service import authenticate, create_token, ensure_first_admin, revoke_token

ROOT = Path(__file__).resolve().parents[2]


def admin_tokens(database_url: str) -> list[ApiToken]:
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            return list(session.exec(select(ApiToken).where(ApiToken.role == TokenRole.admin.value)).all())
    finally:
        engine.dispose()


def test_epctl_up_makes_one_admin_token_shows_it_once_and_reuses_it(
    empty_database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=empty_database_url, data_dir=tmp_path / "data")
    first, shown = _session_admin_token(settings)
    assert shown
    assert admin_token_file(settings).read_text().strip() == first
    assert admin_token_file(settings).stat().st_mode & 0o077 == 0  # 0600
    for _ in range(3):  # later `epctl up` runs
        assert _session_admin_token(settings) == (first, False)
    assert len(admin_tokens(empty_database_url)) == 1


def test_the_env_admin_token_is_honoured_after_a_revoke_and_a_restart(database_url: str) -> None:
    secret = "env-admin-token-0123456789abcdef"
    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            ensure_first_admin(session, env_secret=secret)
            create_token(session, name="second-admin", role=TokenRole.admin)  # the last is never revoked
            revoke_token(session, ref="admin-env")
            assert authenticate(session, secret=secret) is None
            ensure_first_admin(session, env_secret=secret)  # the restart
            assert authenticate(session, secret=secret) is not None
            changed = "env-admin-token-changed-456789abcdef"
            ensure_first_admin(session, env_secret=changed)  # a new value replaces the old one
            assert authenticate(session, secret=changed) is not None
            assert authenticate(session, secret=secret) is None
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "overrides",
    [
        {"hooks_inbound_secret": ""},
        {"hooks_inbound_secret": "   "},
        {"hooks_inbound_secrets": {"demo": ""}},
        {"job_lease_s": float("inf")},
        {"webhook_retry_max_s": float("nan")},
    ],
)
def test_configuration_that_cannot_work_stops_start_up(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load_settings(**overrides)


def test_docs_are_served_without_a_third_party_origin(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(source.startswith("/") for source in sources), sources
    for source in sources:
        asset = client.get(source)
        assert asset.status_code == 200 and len(asset.content) > 0, source
    assert "cdn." not in page.text and "https://" not in page.text
    assert client.get("/redoc").status_code == 404


def test_the_dashboard_has_a_content_security_policy_and_no_inline_script(client: TestClient) -> None:
    page = client.get("/ui/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "unsafe-eval" not in policy
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page.text), "inline scripts would be blocked"


def test_the_readme_is_self_contained() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which is not in the repository"
    assert not re.search(r"^\s*open \$", readme, re.M), "`open` is macOS-only"


def test_the_sqlite_file_is_created_0600_and_an_older_readable_one_made_so(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a permissive umask: the mode must not depend on it
    try:
        fresh = tmp_path / "fresh" / "epctl.db"
        engine = make_engine(f"sqlite:///{fresh}")
        with engine.connect() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            connection.commit()
        engine.dispose()
        older = tmp_path / "older.db"
        older.touch(mode=0o644)
        (tmp_path / "older.db-wal").touch(mode=0o644)
        make_engine(f"sqlite:///{older}").dispose()
    finally:
        os.umask(old)
    for path in (fresh, *fresh.parent.glob("epctl.db-*"), older, tmp_path / "older.db-wal"):
        assert path.stat().st_mode & 0o777 == 0o600, path
