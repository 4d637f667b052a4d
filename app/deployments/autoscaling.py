"""A deployment's autoscaling behaviour, in the shape operators know from Kubernetes' HPA `behavior`:
a stabilization window per direction (scale-down 300 s, scale-up 0 s by default, as in HPA) and an
optional largest step per period. `paused` (KEDA's `autoscaling.keda.sh/paused`) is a column of its own
beside it. The rule that applies them is `app.scale.stabilize`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_WINDOW_S = 3600.0  # HPA's own limit on a stabilization window: one hour
MAX_PERIOD_S = 1800.0  # HPA's own limit on a policy's period: 30 minutes
DEFAULT_SCALE_DOWN_WINDOW_S = 300.0
DEFAULT_SCALE_UP_WINDOW_S = 0.0


class ScalingRules(BaseModel):
    """One direction's rules (HPA's `scaleUp` / `scaleDown`)."""

    model_config = ConfigDict(extra="forbid")

    stabilization_window_s: float = Field(
        ge=0,
        le=MAX_WINDOW_S,
        allow_inf_nan=False,
        strict=True,
        description="how long every ask must have agreed before the deployment moves this way",
    )
    max_step: int | None = Field(
        None,
        ge=1,
        le=1024,
        strict=True,
        description="at most this many engines added (or removed) within `period_s` by autoscalers; a move "
        "asking for more is cut to it (null: no limit)",
    )
    period_s: float = Field(
        60.0, gt=0, le=MAX_PERIOD_S, allow_inf_nan=False, strict=True, description="the step's period"
    )


def _scale_down_default() -> ScalingRules:
    return ScalingRules(stabilization_window_s=DEFAULT_SCALE_DOWN_WINDOW_S)


def _scale_up_default() -> ScalingRules:
    return ScalingRules(stabilization_window_s=DEFAULT_SCALE_UP_WINDOW_S)


class ScalingBehavior(BaseModel):
    """How autoscaler intents move the deployment (HPA's `behavior`). Operator jobs, `/scale` writes
    and self-healing are not subject to it."""

    model_config = ConfigDict(extra="forbid")

    scale_down: ScalingRules = Field(default_factory=_scale_down_default)
    scale_up: ScalingRules = Field(default_factory=_scale_up_default)

    @model_validator(mode="before")
    @classmethod
    def _direction_defaults(cls, value: Any) -> Any:
        """A direction given in part keeps that direction's default window (as HPA's do)."""
        if isinstance(value, dict):
            value = dict(value)
            for direction, window in (
                ("scale_down", DEFAULT_SCALE_DOWN_WINDOW_S),
                ("scale_up", DEFAULT_SCALE_UP_WINDOW_S),
            ):
                if isinstance(value.get(direction), dict):
                    value[direction] = {"stabilization_window_s": window, **value[direction]}
        return value

    @classmethod
    def stored(cls, value: dict[str, Any] | None) -> ScalingBehavior:
        """The behaviour stored on a deployment row (NULL: the defaults)."""
        return cls.model_validate(value) if value else cls()

    def merged(self, update: ScalingBehaviorUpdate) -> ScalingBehavior:
        """This behaviour with an update's given fields applied (a direction's unset fields keep)."""
        current = self.model_dump()
        for direction in ("scale_down", "scale_up"):
            given = getattr(update, direction)
            if given is not None:
                changes = given.model_dump(exclude_unset=True)
                # `max_step: null` removes the limit; a null window or period changes nothing.
                current[direction].update(
                    {k: v for k, v in changes.items() if v is not None or k == "max_step"}
                )
        return ScalingBehavior.model_validate(current)


class ScalingRulesUpdate(BaseModel):
    """Only the fields given change (`max_step: null` removes the limit)."""

    model_config = ConfigDict(extra="forbid")

    stabilization_window_s: float | None = Field(
        None, ge=0, le=MAX_WINDOW_S, allow_inf_nan=False, strict=True
    )
    max_step: int | None = Field(None, ge=1, le=1024, strict=True)
    period_s: float | None = Field(None, gt=0, le=MAX_PERIOD_S, allow_inf_nan=False, strict=True)


class ScalingBehaviorUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale_down: ScalingRulesUpdate | None = None
    scale_up: ScalingRulesUpdate | None = None


class IntentSummary(BaseModel):
    """One standing autoscaler intent, as a deployment shows it."""

    id: str
    source: str
    state: str = Field(description="pending (not yet acted on) or acted")
    target_dp_size: int
    requester: str | None
    reason: str | None
    since: datetime
    job_id: str | None = Field(description="the job that acted on it (null: pending, or found at its size)")
    request_id: str | None = Field(description="the hook record that asked for it")
