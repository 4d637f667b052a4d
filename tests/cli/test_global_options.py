"""`--url`, `--token` and `--json` before or after the command, and listed in `epctl --help`."""

from __future__ import annotations

import json

from app.cli.main import app as cli_app
from tests.cli.epctl_runner import runner
from tests.support.processes import Coordinator

NO_ENVIRONMENT = {"EPCTL_URL": None, "EPCTL_TOKEN": None}  # CliRunner: None unsets a variable
NOWHERE = "http://127.0.0.1:9"


def test_token_and_url_before_the_command_reach_the_coordinator(coordinator: Coordinator) -> None:
    args = ["--token", coordinator.admin_token, "--url", coordinator.url, "jobs", "list"]
    result = runner.invoke(cli_app, args, env=NO_ENVIRONMENT)
    assert result.exit_code == 0, result.output


def test_the_equals_form_and_json_between_the_group_and_its_command(coordinator: Coordinator) -> None:
    args = [f"--url={coordinator.url}", "jobs", "--json", "list", f"--token={coordinator.admin_token}"]
    result = runner.invoke(cli_app, args, env=NO_ENVIRONMENT)
    assert result.exit_code == 0, result.output
    assert "data" in json.loads(result.stdout)


def test_an_option_on_the_command_wins_over_the_same_option_before_it(coordinator: Coordinator) -> None:
    args = ["--url", NOWHERE, "jobs", "list", "--url", coordinator.url, "--token", coordinator.admin_token]
    result = runner.invoke(cli_app, args, env=NO_ENVIRONMENT)
    assert result.exit_code == 0, result.output


def test_an_option_before_the_command_overrides_the_environment(coordinator: Coordinator) -> None:
    env = {"EPCTL_URL": NOWHERE, "EPCTL_TOKEN": coordinator.admin_token}
    result = runner.invoke(cli_app, ["--url", coordinator.url, "jobs", "list"], env=env)
    assert result.exit_code == 0, result.output


def test_the_top_level_help_lists_the_global_options() -> None:
    result = runner.invoke(cli_app, ["--help"])
    assert result.exit_code == 0
    for option in ("--url", "--token", "--json", "EPCTL_URL", "EPCTL_TOKEN"):
        assert option in result.stdout, result.stdout
    assert "before or after the command" in " ".join(result.stdout.split())


def test_a_global_option_a_command_does_not_take_is_left_to_the_root_and_ignored() -> None:
    result = runner.invoke(cli_app, ["--json", "serve", "--help"])
    assert result.exit_code == 0, result.output
    assert "Run the coordinator" in result.stdout


def test_nothing_after_a_double_dash_moves() -> None:
    result = runner.invoke(cli_app, ["--url", NOWHERE, "scale", "demo", "2", "--", "--json"])
    assert result.exit_code == 2  # "--json" after "--" is an extra argument, not the option
    assert "unexpected extra argument" in result.output.lower()
