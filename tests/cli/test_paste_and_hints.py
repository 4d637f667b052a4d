"""Lines a new user pastes or reads first: the welcome's `epctl` named as this shell can run it, and a
missing token answered with where a token comes from (in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.client import CoordinatorError, missing_token_hint, print_problem
from app.cli.welcome import runnable_epctl


def test_epctl_not_on_path_is_named_by_the_path_it_was_started_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / ".venv" / "bin" / "epctl"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert runnable_epctl(str(script), cwd=tmp_path) == ".venv/bin/epctl"
    assert runnable_epctl(str(script), cwd=tmp_path / "elsewhere") == str(script)
    assert runnable_epctl(str(script), cwd=script.parent) == "./epctl"


def test_epctl_on_path_is_just_epctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "epctl"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(script.parent))
    assert runnable_epctl(str(script), cwd=tmp_path) == "epctl"


def test_a_missing_token_names_the_option_the_variable_and_the_kept_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EPCTL_DATA_DIR", raising=False)
    assert "<data dir>/admin-token" in missing_token_hint()  # no file here: where it would be
    (tmp_path / ".data").mkdir()
    (tmp_path / ".data" / "admin-token").write_text("secret\n")
    problem = {"title": "Unauthorized", "detail": "missing bearer token", "code": "missing-token"}
    print_problem(CoordinatorError(401, problem))
    err = " ".join(capsys.readouterr().err.split())
    assert "pass --token or set EPCTL_TOKEN" in err, err
    assert "export EPCTL_TOKEN=$(cat .data/admin-token)" in err, err
