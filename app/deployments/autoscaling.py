"""A deployment's autoscaling behaviour, in the shape operators know from Kubernetes' HPA `behavior`:
per direction a stabilization window (scale-down 300 s, scale-up 0 s by default, as in HPA), rate
policies (`Pods` or `Percent` per period; `max_step`/`period_s` is the shorthand for one `Pods` policy)
and `select_policy` (`Max`, `Min`, `Disabled`). With no policy, HPA's defaults apply: up, the larger of
+100 % and +4 engines per 15 s; down, -100 % per 15 s. `paused` (KEDA's `autoscaling.keda.sh/paused`) is
a column of its own beside it. The rule that applies them is `app.scale.stabilize`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_WINDOW_S = 3600.0  # HPA's own limit on a stabilization window: one hour
MAX_PERIOD_S = 1800.0  # HPA's own limit on a policy's period: 30 minutes
DEFAULT_SCALE_DOWN_WINDOW_S = 300.0
DEFAULT_SCALE_UP_WINDOW_S = 0.0
SelectPolicy = Literal["Max", "Min", "Disabled"]


class ScalingPolicy(BaseModel):
    """One rate limit (HPA's `HPAScalingPolicy`): within `period_s`, at most `value` engines (`Pods`) or
    `value` percent of the size at the period's start (`Percent`) added (or removed)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1, le=100_000, strict=True)
    period_s: float = Field(gt=0, le=MAX_PERIOD_S, allow_inf_nan=False, strict=True)


# HPA's defaults (k8s.io/kubernetes pkg/apis/autoscaling/v2/defaults.go), used where a direction has none.
DEFAULT_SCALE_UP_POLICIES = (
    ScalingPolicy(type="Percent", value=100, period_s=15.0),
    ScalingPolicy(type="Pods", value=4, period_s=15.0),
)
DEFAULT_SCALE_DOWN_POLICIES = (ScalingPolicy(type="Percent", value=100, period_s=15.0),)


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
        description="shorthand for a `Pods` policy: at most this many engines added (or removed) within "
        "`period_s` by autoscalers; a move asking for more goes there and steps on, period after period, "
        "until it reaches the ask (null: none)",
    )
    period_s: float = Field(
        60.0, gt=0, le=MAX_PERIOD_S, allow_inf_nan=False, strict=True, description="the step's period"
    )
    policies: list[ScalingPolicy] | None = Field(
        None,
        max_length=16,
        description="rate policies, as HPA's (with `max_step`'s, if set); none at all: HPA's defaults",
    )
    select_policy: SelectPolicy = Field(
        "Max",
        description="Max: the policy allowing the largest change applies (HPA's default); Min: the "
        "smallest; Disabled: autoscalers never move the deployment this way",
    )

    def effective_policies(self, up: bool) -> tuple[ScalingPolicy, ...]:
        given = list(self.policies or [])
        if self.max_step is not None:
            given.append(ScalingPolicy(type="Pods", value=self.max_step, period_s=self.period_s))
        if given:
            return tuple(given)
        return DEFAULT_SCALE_UP_POLICIES if up else DEFAULT_SCALE_DOWN_POLICIES


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
                # `max_step: null` and `policies: null` remove them; a null window or period changes nothing.
                current[direction].update(
                    {k: v for k, v in changes.items() if v is not None or k in ("max_step", "policies")}
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
    policies: list[ScalingPolicy] | None = Field(None, max_length=16)
    select_policy: SelectPolicy | None = None


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
    job_id: str | None = Field(
        description="the job that acted on it last (a step toward it while still pending; null: none yet, "
        "or found at its size)"
    )
    attempts: int = Field(0, description="moves for it that failed or rolled back (each retried)")
    retry_at: datetime | None = Field(None, description="when a failed move for it is tried again")
    request_id: str | None = Field(description="the hook record that asked for it")
