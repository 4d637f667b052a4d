"""The Ray launcher's pure parts: the agent's command line, the engines' platform, and how Ray's causes
are put into words. (The launcher itself runs against a real Ray cluster in `tests/ray/`.)"""

from __future__ import annotations

from app.launchers.base import LaunchSpec
from app.launchers.ray_diagnosis import death_cause_text, one_line, resources_text
from app.launchers.ray_launcher import agent_args
from app.launchers.ray_settings import RaySettings
from engine_agent.protocol import EngineConfig, Platform


def test_engines_with_gpus_run_on_cuda_unless_told_otherwise() -> None:
    assert RaySettings().engine_platform() == Platform.cpu
    assert RaySettings(num_gpus=1).engine_platform() == Platform.cuda
    assert RaySettings(num_gpus=1, platform=Platform.rocm).engine_platform() == Platform.rocm


def test_the_agent_command_line_carries_no_token() -> None:
    spec = LaunchSpec(
        deployment="big", engine=EngineConfig(), coordinator_url="http://10.0.0.1:8000", token="epctl_secret"
    )
    args = agent_args(spec, RaySettings(num_gpus=1))
    assert "epctl_secret" not in " ".join(args) and "--token" not in args
    assert args[args.index("--platform") + 1] == "cuda"
    assert args[args.index("--coordinator") + 1] == "http://10.0.0.1:8000"


def test_resources_read_as_an_operator_would() -> None:
    ray_view = {
        "CPU": 4.0,
        "GPU": 2.0,
        "memory": 8 * 2**30,
        "object_store_memory": 1e9,
        "node:127.0.0.1": 1.0,
        "CPU_group_0_9ec73271": 0.5,
        "bundle_group_9ec73271": 2000.0,
    }
    assert resources_text(ray_view) == "{CPU: 4, GPU: 2, memory: 8.0 GiB}"


def test_a_death_cause_becomes_one_sentence() -> None:
    killed = {
        "actor_died_error_context": {
            "error_message": "The actor is dead because it was killed by `ray.kill`.",
            "reason": "RAY_KILL",
            "pid": 1,
        }
    }
    assert (
        death_cause_text(killed) == "The actor is dead because it was killed by `ray.kill`.; reason RAY_KILL"
    )
    lost = {
        "actor_died_error_context": {
            "error_message": "The actor died because its node has died.",
            "node_death_info": {"reason": "UNEXPECTED_TERMINATION", "reason_message": "health check failed"},
        }
    }
    text = death_cause_text(lost)
    assert "node has died" in text and "UNEXPECTED_TERMINATION health check failed" in text
    assert death_cause_text({"runtime_env_failed_context": {"error_message": "pip failed"}}) == "pip failed"


def test_long_causes_are_cut_to_one_line() -> None:
    text = one_line("a\n  b\t" + "x" * 2000)
    assert text.startswith("a b x") and len(text) == 700 and text.endswith("...")
