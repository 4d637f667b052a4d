"""The gloo weight channel: send/recv over a transfer process group built from the job's store, the
fallback where NIXL is not installed. Host memory only: device tensors travel through a host copy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend
from engine_agent.transfer.base import (
    ChannelOpening,
    Deadline,
    TransferError,
    TransferStats,
    TransferTimeout,
    WeightChannel,
    as_bytes,
    check_in,
    my_part,
    nbytes_of,
)

logger = logging.getLogger(__name__)


class GlooChannel(WeightChannel):
    """send/recv per plan item over a ProcessGroupGloo of all participants (rank = index)."""

    backend = TransferBackend.gloo

    def __init__(self, opening: ChannelOpening) -> None:
        super().__init__(opening)
        self._rank_of = {engine: rank for rank, engine in enumerate(self._participants)}
        # Any: the torch stubs lack ProcessGroupGloo's send/recv/_Options.
        self._group: Any = None
        store = opening.store
        # Our own barrier first: the group's constructor would wait on the store's timeout (not ours)
        # and fail without naming who is missing.
        check_in(
            store,
            "gloo/here",
            self._me,
            self._participants,
            Deadline(self._timeout_s, self._abort),
            "opening the gloo transfer group",
        )
        gloo: Any = dist.ProcessGroupGloo
        options = gloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=opening.data_host)]
        options._timeout = timedelta(seconds=self._timeout_s)
        self._group = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo/pg", store), self._rank_of[self._me], len(self._participants), options
        )

    def transfer(
        self,
        plan: Sequence[TransferItem],
        sources: Mapping[int, torch.Tensor],
        destinations: Mapping[int, torch.Tensor],
        on_progress: Callable[[int], None] | None = None,
    ) -> TransferStats:
        if self._group is None:
            raise TransferError("the gloo channel is closed")
        started = time.monotonic()
        deadline = Deadline(self._timeout_s)
        roles = my_part(plan, self._me, self._participants, sources, destinations)
        sends: list[tuple[dist.Work, int]] = []
        receives: list[tuple[dist.Work, TransferItem, torch.Tensor, torch.Tensor]] = []
        # Post every send and receive at once, in plan order, each tagged with its plan index, so
        # no pair of engines can wait on each other.
        for index, item in sorted(roles.serve + roles.fetch, key=lambda pair: pair[0]):
            if item.src == self._me:
                payload = as_bytes(sources[item.logical_expert])
                if payload.device.type != "cpu":
                    payload = payload.cpu()  # gloo moves host memory; NIXL is the device path
                work = self._group.send([payload], self._rank_of[item.dst], index)
                sends.append((work, nbytes_of(payload)))
            else:
                target = destinations[item.logical_expert]
                landing = as_bytes(target)
                if landing.device.type != "cpu":
                    landing = torch.empty(landing.numel(), dtype=torch.uint8)
                assert item.src is not None  # my_part skips checkpoint items
                work = self._group.recv([landing], self._rank_of[item.src], index)
                receives.append((work, item, target, landing))
        received = 0
        for work, item, target, landing in receives:
            self._wait(work, deadline, f"receiving expert {item.logical_expert} from {item.src}")
            if landing.data_ptr() != target.data_ptr():
                as_bytes(target).copy_(landing)
            received += landing.numel()
            if on_progress is not None:
                on_progress(received)
        sent = 0
        for work, nbytes in sends:
            self._wait(work, deadline, "sending expert weights")
            sent += nbytes
        return TransferStats(self.backend, received, sent, time.monotonic() - started)

    def _wait(self, work: dist.Work, deadline: Deadline, what: str) -> None:
        try:
            work.wait(timedelta(seconds=deadline.remaining()))
        except Exception as error:
            if deadline.expired() or "timeout" in str(error).lower() or "timed out" in str(error).lower():
                raise TransferTimeout(f"{what}: not done within {self._timeout_s:g} s") from error
            raise TransferError(f"{what}: {error}") from error

    def close(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        try:
            group.shutdown()
        except Exception:  # a broken group cannot shut down cleanly; abort returns at once
            logger.warning("gloo transfer group did not shut down cleanly; aborting it", exc_info=True)
            group.abort()
