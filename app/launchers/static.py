"""The static pool: engines are agents that registered themselves; nothing is started or stopped."""

from __future__ import annotations

from collections.abc import Sequence

from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec


class StaticLauncher(Launcher):
    name = "static"

    async def ensure_engines(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> list[EngineHandle]:
        if len(idle) < count:
            raise LaunchError(
                f"deployment {spec.deployment} needs {count} idle registered engines, {len(idle)} available",
                type_="not-enough-engines",
            )
        return list(idle[:count])

    async def ensure_some(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        if len(idle) >= count:
            return list(idle[:count]), None
        try:  # the pool as it is: nothing to start
            await self.ensure_engines(spec, count, idle, deadline_s=deadline_s)
        except LaunchError as exc:
            return list(idle), exc
        return list(idle[:count]), None

    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        return []  # registered agents stay in the pool, idle
