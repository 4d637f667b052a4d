"""The reference engine's canary probe (`EPCTL_PROBE_*`): on by default, a steady rate per engine,
capped in total so that a large fleet costs no more than a small one."""

from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.config import ConfigError


class ProbeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPCTL_PROBE_", extra="ignore", env_ignore_empty=True)

    enabled: bool = Field(True, description="send canaries to the serving engines while a job runs")
    interval_s: float = Field(0.02, gt=0, description="one canary per serving engine per this")
    max_rate_per_s: float = Field(
        200.0, gt=0, description="canaries per second in all: with many engines the interval grows"
    )
    timeout_s: float = Field(5.0, gt=0, description="a canary unanswered this long failed (and is dropped)")
    deadline_s: float = Field(
        1.0,
        gt=0,
        description="a canary answered later than this is counted late (`canaries_late`); the outage "
        "is the longest stretch with no successful answer, late ones ending it like any other",
    )
    baseline_s: float = Field(0.3, ge=0, description="canaries before the job starts, for comparison")

    def interval_for(self, targets: int) -> float:
        """The interval that keeps `targets` engines within `max_rate_per_s`."""
        return max(self.interval_s, targets / self.max_rate_per_s)


def load_probe_settings() -> ProbeSettings:
    """The probe's settings, or `ConfigError` naming every bad `EPCTL_PROBE_*` value."""
    try:
        return ProbeSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"EPCTL_PROBE_{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None
