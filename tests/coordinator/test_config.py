"""Settings: sensible defaults, and bad configuration stops start-up with a clear message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.config import ConfigError, load_settings
from app.main import create_app

EPCTL = str(Path(sys.executable).with_name("epctl"))


def test_the_default_database_is_a_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data", database_url="")
    assert settings.database_url == f"sqlite:///{tmp_path / 'data' / 'epctl.db'}"


def test_postgres_urls_use_psycopg3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://u@db:5432/epctl")
    assert load_settings().database_url == "postgresql+psycopg://u@db:5432/epctl"


def test_an_unsupported_database_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ConfigError, match=r"database_url: .*unsupported database URL 'mysql'"):
        load_settings(database_url="mysql://x/y")


def test_a_short_admin_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPCTL_ADMIN_TOKEN", "short")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_settings()


def test_importing_the_app_with_bad_configuration_works_but_starting_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPCTL_PORT", "not-a-port")
    app = create_app()
    with pytest.raises(ConfigError, match="port"), TestClient(app):
        pass


@pytest.mark.processes
def test_epctl_serve_with_bad_configuration_exits_with_the_reason(tmp_path: Path) -> None:
    result = subprocess.run(
        [EPCTL, "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": "oracle://nope"},
    )
    assert result.returncode == 2
    assert "invalid configuration" in result.stderr and "oracle" in result.stderr


def test_the_first_start_creates_the_data_directory(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "fresh" / "data", database_url="")
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 200
    assert (tmp_path / "fresh" / "data" / "epctl.db").exists()
