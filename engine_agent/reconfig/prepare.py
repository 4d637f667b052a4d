"""The work that builds a new generation, one body per `Step`, and the sync over the new group.

`Builder.run` runs the steps the table in `steps.py` gives a job (in prepare, or inside the stopped
window for the blocking strategy): each step first reports itself in the status, checks for an abort
and meets the fault switches, then does its work. Nothing here stops or resumes serving."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from engine_agent import groups, moe, step_graphs
from engine_agent.placement import TransferItem, plan_layer_transfers
from engine_agent.protocol import ReconfigPhase, layer_placements
from engine_agent.reconfig.errors import Aborted, ReconfigError
from engine_agent.reconfig.faults import FaultSwitches
from engine_agent.reconfig.job import Job, Site
from engine_agent.reconfig.steps import Step
from engine_agent.transfer import available_backends, open_channel

log = logging.getLogger(__name__)

AGREE_POLL_S = 0.02


class Builder:
    def __init__(self, site: Site, faults: FaultSwitches) -> None:
        self.site = site
        self.faults = faults
        self._bodies: dict[Step, Callable[[Job], None]] = {
            Step.wait_cleanup: self._wait_cleanup,
            Step.connect_store: self._connect_store,
            Step.agree: self._agree,
            Step.create_groups: self._create_groups,
            Step.stage_placement: self._stage_placement,
            Step.open_channel: self._open_channel,
            Step.transfer: self._transfer,
            Step.warm_up: self._warm_up,
            Step.capture_graphs: self._capture_graphs,
        }

    def run(self, job: Job, steps: tuple[Step, ...]) -> dict[Step, float]:
        """Run `steps` in order; the milliseconds each took."""
        took: dict[Step, float] = {}
        for step in steps:
            started = time.monotonic()
            self._enter(job, step)
            self._bodies[step](job)
            took[step] = (time.monotonic() - started) * 1000.0
        return took

    def _enter(self, job: Job, step: Step) -> None:
        """Progress, abort check, and the test-only fault switches."""
        if job.abort.is_set():
            raise Aborted()
        board = self.site.board
        with board.lock:
            done = job.counted.index(step) if step in job.counted else job.status.steps_done
            board.update(job, step=step.value, steps_done=done)
        fail, hang = self.faults.at_step(step.value)
        if fail:
            raise ReconfigError("injected-failure", f"prepare failed at step {step} (fault injection)")
        if hang and not self.faults.hold(job.abort):
            raise Aborted()

    # ---- the steps ---------------------------------------------------------------------------------

    def _wait_cleanup(self, job: Job) -> None:
        cleanup = self.site.cleanup
        if not cleanup.wait_idle(job.request.timeouts.collective_s):
            raise ReconfigError("cleanup-pending", "cleanup of a retired generation is still running")
        failure = cleanup.unresolved_failure()
        if failure is not None:
            raise ReconfigError(
                "cleanup-failed",
                f"unresolved cleanup failure of job {failure.job_id} (generation {failure.generation}): "
                f"{failure.error}; POST /v1/cleanup/retry or /v1/cleanup/acknowledge first",
            )

    def _connect_store(self, job: Job) -> None:
        request = job.request
        try:
            job.store_client = groups.connect_store(request.store, request.timeouts.rendezvous_s)
        except (RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
            where = f"{request.store.host}:{request.store.port}"
            raise ReconfigError("store-unreachable", f"rendezvous store {where}: {exc}") from exc
        job.store = groups.prefixed(
            job.store_client,
            groups.generation_prefix(request.generation, request.job_id, request.store_prefix),
        )

    def _agree(self, job: Job) -> None:
        """Before the first collective on a new group: every participant publishes its warm-up policy
        and generation, and all must match. A mismatch fails at once, naming the disagreeing engines;
        absent participants fail at the rendezvous deadline."""
        request = job.request
        store = job.store
        assert store is not None
        me = self.site.engine_id
        mine = {"engine_id": me, "policy": str(job.policy), "generation": request.generation}
        store.set(f"agree/{me}", json.dumps(mine))
        deadline = time.monotonic() + request.timeouts.rendezvous_s
        seen: dict[str, dict[str, object]] = {}
        while True:
            for engine in job.participants:
                if engine not in seen and store.check([f"agree/{engine}"]):
                    seen[engine] = json.loads(store.get(f"agree/{engine}"))
            disagreeing = sorted(
                engine
                for engine, value in seen.items()
                if value["policy"] != str(request.warmup_policy) or value["generation"] != request.generation
            )
            if disagreeing:
                held = ", ".join(f"{e}={seen[e]['policy']}@gen{seen[e]['generation']}" for e in sorted(seen))
                raise ReconfigError(
                    "policy-mismatch",
                    f"warm-up policy/generation disagreement for job {request.job_id}: the job says "
                    f"{request.warmup_policy}@gen{request.generation}; engines {', '.join(disagreeing)} "
                    f"disagree ({held})",
                    engines=disagreeing,
                )
            missing = [e for e in job.participants if e not in seen]
            if not missing:
                return
            if job.abort.is_set():
                raise Aborted()
            if time.monotonic() > deadline:
                raise ReconfigError(
                    "rendezvous-timeout",
                    f"no word from {', '.join(missing)} within {request.timeouts.rendezvous_s:g} s",
                    engines=missing,
                )
            time.sleep(AGREE_POLL_S)

    def _create_groups(self, job: Job) -> None:
        request = job.request
        rank = job.me_new_rank
        assert rank is not None and job.store is not None
        job.standby.add(
            groups.create_group(
                name="ep",
                generation=request.generation,
                store=groups.prefixed(job.store, "ep/"),
                rank=rank,
                size=len(request.members),
                platform=self.site.platform,
                device=self.site.device,
                device_host=self.site.data_host,
                timeout_s=request.timeouts.collective_s,
                serving_timeout_s=request.timeouts.serving_collective_s,
            )
        )

    def _stage_placement(self, job: Job) -> None:
        rank = job.me_new_rank
        assert rank is not None
        config, device = self.site.config, self.site.device
        placements = layer_placements(job.request.placement, job.request.placements)
        # One stack per layer, each expert a view of its row (`moe.ExpertStack`).
        wanted = {layer: sorted(set(p[rank])) for layer, p in enumerate(placements)}
        job.staged, job.stacks = moe.stack_buffers(config, wanted, device)
        self.site.board.update(job, bytes_total=len(job.staged) * moe.expert_nbytes(config))

    def _open_channel(self, job: Job) -> None:
        request = job.request
        if request.transfer_backend not in available_backends():
            raise ReconfigError(
                "transfer-backend-unavailable",
                f"transfer backend {request.transfer_backend} is not available here",
            )
        if not any(item.src is not None for item in self._transfer_plan(job)):
            # Nobody sends anything (a generation re-formed after its group broke, or every expert from
            # the checkpoint): every participant reads the same plan, so all skip the channel, whose
            # set-up (a NIXL agent, a gloo rendezvous) cost about 1 s of a self-heal job's prepare.
            self.site.board.update(job, transfer_backend=None)  # the status says no channel moved any
            return
        assert job.store is not None
        job.channel = open_channel(
            request.transfer_backend,
            engine_id=self.site.engine_id,
            participants=job.participants,
            store=groups.prefixed(job.store, "xfer/"),
            device=self.site.device,
            data_host=self.site.data_host,
            timeout_s=request.timeouts.transfer_s,
            abort=job.abort,  # a peer that died never comes: the abort ends the wait for it
        )

    def _transfer(self, job: Job) -> None:
        """Fill the staged buffers: local copies for experts held already (by the old generation, or by
        one that broke under this engine), the checkpoint (recompute from the seed) for experts no old
        engine holds, the weight channel for the rest; the status counts bytes by source."""
        request, site = job.request, self.site
        me, active = site.engine_id, site.engine.active
        if job.steps.in_old:
            self._check_old_placement(job)
        held = dict(active.weights) if job.steps.in_old and active else {}
        # A joiner that served a generation which broke still holds its rows: what it holds of its new
        # rows is copied here, not loaded again (a self-heal shrink then loads and receives nothing).
        local = held if job.steps.in_old else site.resident.weights()
        plan = self._transfer_plan(job)
        expert_bytes = moe.expert_nbytes(site.config)
        moved = 0

        def progress(nbytes: int, source: str) -> None:
            site.hooks.on_bytes(nbytes)
            status = job.status
            site.board.update(
                job, bytes_moved=status.bytes_moved + nbytes, **{source: getattr(status, source) + nbytes}
            )

        remote = {item.logical_expert for item in plan if item.dst == me and item.src is not None}
        for expert, buffer in job.staged.items():
            if expert in remote:
                continue
            if expert in local:
                buffer.copy_(local[expert])
                source = "bytes_resident"
            else:
                buffer.copy_(moe.expert_weights(site.config, expert, site.device))
                source = "bytes_loaded"
            moved += expert_bytes
            progress(expert_bytes, source)
        if job.channel is None:  # nothing to receive or send (`_open_channel`)
            log.info("job %s: staged %d experts locally, no weight channel", request.job_id, len(job.staged))
            self._build_views(job)
            return
        received_so_far = 0

        def on_channel_progress(received: int) -> None:
            nonlocal received_so_far
            progress(received - received_so_far, "bytes_received")
            received_so_far = received

        stats = job.channel.transfer(
            plan,
            sources=held,
            destinations={e: job.staged[e] for e in remote},
            on_progress=on_channel_progress,
        )
        if stats.bytes_received > received_so_far:
            progress(stats.bytes_received - received_so_far, "bytes_received")
        # Nobody tears its end down while a peer may still be connecting to it or reading from it.
        self._barrier(job, "xfer_done", job.participants, request.timeouts.transfer_s)
        job.channel.close()
        job.channel = None
        self._build_views(job)
        log.info(
            "job %s: staged %d experts (%d bytes local/checkpoint, %d received, %d sent) via %s in %.3f s",
            request.job_id,
            len(job.staged),
            moved,
            stats.bytes_received,
            stats.bytes_sent,
            stats.backend,
            stats.seconds,
        )

    def _build_views(self, job: Job) -> None:
        """What the engine serves each layer from (replica tables, the batched stacks), built here and
        not at the switch: it is host-side work and device copies that would sit inside the window."""
        if job.steps.in_new and job.me_new_rank is not None:
            job.views = self.site.engine.views_for(
                layer_placements(job.request.placement, job.request.placements),
                job.staged,
                rank=job.me_new_rank,
                stacks=job.stacks,
            )

    def _transfer_plan(self, job: Job) -> list[TransferItem]:
        """Every expert move of the job, the same on every participant (it depends on the request alone)."""
        request = job.request
        return plan_layer_transfers(
            job.old_ids,
            layer_placements(request.old_placement, request.old_placements),
            job.new_ids,
            layer_placements(request.placement, request.placements),
            self.site.config.num_logical_experts,
        )

    def _warm_up(self, job: Job) -> None:
        group = job.standby.get("ep")
        assert group is not None
        groups.warm_up(group)
        job.warmed = True

    def _capture_graphs(self, job: Job) -> None:
        """The new generation's step as CUDA graphs, over the views built in `transfer`: in prepare a
        side stream captures while the old generation serves; a deferred policy runs this inside the
        window instead, after the pause, on every member of the new generation alike."""
        rank = job.me_new_rank
        assert rank is not None and job.views is not None
        try:
            graphs = self.site.engine.capture_graphs(job.views, rank=rank)
        except RuntimeError as exc:  # torch's capture errors: the job fails before commit, at no cost
            raise ReconfigError("graph-capture-failed", f"capturing the step's CUDA graphs: {exc}") from exc
        if graphs is None:
            return
        graphs.in_window = job.paused
        job.graphs = graphs
        self.site.board.update(job, graphs=step_graphs.summary(graphs))

    # ---- helpers -----------------------------------------------------------------------------------

    def _barrier(self, job: Job, name: str, engines: list[str], timeout_s: float) -> None:
        store = job.store
        assert store is not None
        store.set(f"{name}/{self.site.engine_id}", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            missing = [e for e in engines if not store.check([f"{name}/{e}"])]
            if not missing:
                return
            if job.abort.is_set():
                raise Aborted()
            if time.monotonic() > deadline:
                waited = f"{name}: no word from {', '.join(missing)} within {timeout_s:g} s"
                raise ReconfigError("rendezvous-timeout", waited, missing)
            time.sleep(AGREE_POLL_S)

    def _check_old_placement(self, job: Job) -> None:
        me, active = self.site.engine_id, self.site.engine.active
        old_rank = job.old_ids.index(me)
        request, config = job.request, self.site.config
        old = layer_placements(request.old_placement, request.old_placements)
        expected = {moe.flat_id(config, layer, e) for layer, p in enumerate(old) for e in p[old_rank]}
        if active is None or set(active.weights) != expected:
            raise ReconfigError(
                "placement-mismatch",
                f"old_placement[{old_rank}] does not match what {me} holds "
                f"({sorted(active.weights) if active else 'nothing'})",
            )

    # ---- sync --------------------------------------------------------------------------------------

    def sync(self, job: Job) -> None:
        """Agree on the smallest free KV-cache memory over the new group. With a deferred policy and an
        unwarmed group the values go through the store: no collective on a new group before the window.
        A leaver is in no new group: it is synced at once."""
        board = self.site.board
        if not job.steps.in_new:
            board.update(job, phase=ReconfigPhase.synced, step=None)
            return
        value = self.site.engine.free_kv_bytes()
        group = job.standby.get("ep")
        assert group is not None
        if job.warmed:
            tensor = torch.tensor([value], dtype=torch.int64, device=self.site.device)
            synced = int(group.allreduce(tensor, dist.ReduceOp.MIN).item())
        else:
            synced = self._min_through_store(job, value)
        board.update(job, phase=ReconfigPhase.synced, step=None, synced_value=synced)

    def _min_through_store(self, job: Job, value: int) -> int:
        store = job.store
        assert store is not None
        store.set(f"sync/{self.site.engine_id}", str(value))
        keys = [f"sync/{e}" for e in job.new_ids]
        try:
            store.wait(keys, timedelta(seconds=job.request.timeouts.collective_s))
        except Exception as exc:
            missing = [e for e in job.new_ids if not store.check([f"sync/{e}"])]
            raise ReconfigError(
                "sync-timeout", f"no sync value from {', '.join(missing)}: {exc}", missing
            ) from exc
        return min(int(store.get(k)) for k in keys)
