"""An operator names the engine that leaves (not the highest rank): it leaves, the others are
renumbered compactly, the job records the rank map and what the placement moved, outputs stay exact.
A deployment of two MoE layers gets a placement per layer, end to end. (A grow short of engines is
tests/e2e/test_short_of_capacity.py: its agents are fresh interpreters, these are forked from the suite's
zygote.)"""

from __future__ import annotations

import torch

from engine_agent import moe
from tests.support.e2e import Stack
from tests.support.stack import ENGINE, agent_info, infer


def test_retiring_a_middle_engine_renumbers_the_rest_and_keeps_outputs_exact(stack: Stack) -> None:
    grown = stack.scale_to(3)
    assert grown["state"] == "succeeded", grown
    serving = sorted(
        (e for e in stack.coordinator.engines() if e["state"] == "serving"), key=lambda e: e["dp_rank"]
    )
    first, middle, last = (e["id"] for e in serving)

    job = stack.scale_to(2, retire=[middle])

    assert job["state"] == "succeeded", job
    assert job["retire"] == [middle]
    placement = job["placement"]
    assert placement["rank_map"] == {
        first: {"old": 0, "new": 0},
        middle: {"old": 1, "new": None},
        last: {"old": 2, "new": 1},
    }
    assert placement["copies_moved"] >= placement["lower_bound"] >= 0
    assert placement["bytes_moved"] == placement["copies_moved"] * ENGINE.expert_nbytes
    engines = {e["id"]: e for e in stack.coordinator.engines()}
    assert (engines[first]["dp_rank"], engines[last]["dp_rank"]) == (0, 1)
    assert engines[middle]["state"] in ("idle", "left") and engines[middle]["dp_rank"] is None
    assert agent_info(engines[last]["url"])["rank"] == 1
    members = [m["url"] for m in stack.coordinator.members(job)]
    assert members == [engines[first]["url"], engines[last]["url"]]
    stack.assert_outputs_correct(members)


def test_a_two_layer_deployment_plans_every_layer_and_serves_exactly_through_2_3_2(stack: Stack) -> None:
    layered = ENGINE.model_copy(update={"num_moe_layers": 2, "num_redundant_experts": 2})
    coordinator = stack.coordinator
    coordinator.create_deployment("layered", engine=layered.model_dump())
    tokens = torch.randn(5, layered.hidden_size, generator=torch.Generator().manual_seed(11))
    expected = moe.reference_forward(layered, tokens)
    try:
        for target in (2, 3, 2):
            job = stack.scale_to(target, "layered")
            assert job["state"] == "succeeded", job
            assert job["placement"]["layers"] == 2
            members = [m["url"] for m in coordinator.members(job)]
            assert len(members) == target
            for url in members:
                response = infer(url, tokens.tolist())
                assert response.status_code == 200, response.text
                assert torch.allclose(
                    torch.tensor(response.json()["outputs"]), expected, rtol=1e-5, atol=1e-6
                )
            placements = agent_info(members[0])["placements"]
            assert len(placements) == 2 and len(placements[0]) == target
        assert job["placement"]["copies_moved"] >= job["placement"]["lower_bound"]
    finally:
        stack.scale_to(1, "layered")
