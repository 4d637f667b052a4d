"""The agent's command line a launcher builds from a deployment's engine config starts an agent that
runs that same config (the agent registers only with the config its deployment has)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.launchers.agent_args import engine_args
from engine_agent.main import _parser
from engine_agent.protocol import EngineConfig
from engine_agent.settings import AgentSettings
from tests.support.certs import TestCA


@pytest.mark.parametrize(
    "engine",
    [
        EngineConfig(),
        EngineConfig(num_moe_layers=3, dtype="bfloat16", cuda_graphs="off"),
        EngineConfig(cuda_graphs="on", cuda_graph_buckets=[64, 1, 8]),
    ],
)
def test_the_agent_runs_the_engine_config_its_launcher_was_given(engine: EngineConfig) -> None:
    args = _parser().parse_args(["--platform", "cuda", *engine_args(engine)])
    assert AgentSettings.from_options(args, port=1).engine_config() == engine


def test_an_agent_refuses_top_k_above_its_expert_count() -> None:
    args = _parser().parse_args(["--num-logical-experts", "4", "--top-k", "5"])
    with pytest.raises(ValueError, match=r"top_k \(5\) must not exceed num_logical_experts \(4\)"):
        AgentSettings.from_options(args, port=1)


def test_agent_tls_options_left_out_keep_their_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A launcher passes TLS files through the environment: an option not given must not unset them."""
    ca = TestCA(tmp_path, "ca")
    files = ca.server("agent")
    monkeypatch.setenv("EPCTL_AGENT_TLS_CA_FILE", str(ca.ca_file))
    settings = AgentSettings.from_options(_parser().parse_args([]), port=1)
    assert settings.tls_ca_file == str(ca.ca_file) and settings.served_url(1) == "http://127.0.0.1:1"
    monkeypatch.setenv("EPCTL_AGENT_TLS_CERT_FILE", str(files.cert))
    monkeypatch.setenv("EPCTL_AGENT_TLS_KEY_FILE", str(files.key))
    assert AgentSettings.from_options(_parser().parse_args([]), port=1).served_url(1) == "https://127.0.0.1:1"
    monkeypatch.delenv("EPCTL_AGENT_TLS_KEY_FILE")
    with pytest.raises(ValueError, match="needs its key"):
        AgentSettings.from_options(_parser().parse_args(["--tls-cert-file", "/nonexistent.pem"]), port=1)
