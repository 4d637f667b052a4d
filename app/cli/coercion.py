"""A fast path for typer's parameter coercion, so that a plain `epctl` command does not import pydantic.

typer 0.29 converts every parameter value, defaults included, through a pydantic `TypeAdapter`;
importing pydantic for that costs ~0.1 s of CPU, a third of a simple read's start-up. Most values
need no conversion at all: a string for a `str` parameter, a default that already has its type. Those
are passed through here; any other value (`-n 5` for an `int`, a path, a choice) goes to typer's own
coercion, unchanged, so its semantics and its error messages stay typer's.

This hooks `typer.core.build_runtime_param`, which is not public API: `install()` does nothing when
the names it needs are missing, and `tests/cli/test_cli_coercion.py` checks that every value taken
by the fast path comes out as typer's own coercion makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PASSED_THROUGH: dict[Any, tuple[type, ...]] = {
    str: (str,),
    bool: (bool,),
    int: (int,),
    float: (float,),
    list[str]: (list, tuple),
}


def needs_no_conversion(annotation: Any, parameter_info: Any, value: Any) -> bool:
    """Whether typer's coercion would give `value` back as it is (a list: as a list)."""
    kinds = PASSED_THROUGH.get(annotation)
    if kinds is None or getattr(parameter_info, "parser", None) is not None:
        return False
    if annotation is list[str]:
        return isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)
    if not isinstance(value, kinds) or (isinstance(value, bool) and annotation is not bool):
        return False  # (a bool is an int to Python, not to typer)
    low, high = getattr(parameter_info, "min", None), getattr(parameter_info, "max", None)
    return (low is None or value >= low) and (high is None or value <= high)


def install() -> None:
    """Route typer's coercion through the fast path (idempotent; a no-op on a typer without the hook)."""
    try:
        from typer import core
        from typer._coercion import RuntimeParam
    except ImportError:
        return
    found: Any = getattr(core, "build_runtime_param", None)
    if found is None or getattr(found, "epctl_fast_path", False):
        return
    typer_build: Callable[[Any], Any] = found

    @dataclass(frozen=True)
    class AsGivenOrTypers(RuntimeParam):  # type: ignore[misc]
        descriptor: Any = None
        _typers: list[Any] = field(default_factory=list)  # typer's own, built on first need

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if needs_no_conversion(self.annotation, self.parameter_info, value):
                return list(value) if self.annotation is list[str] else value
            if not self._typers:
                self._typers.append(typer_build(self.descriptor))
            return self._typers[0]._coerce_value(value, param=param, ctx=ctx)

    def build(descriptor: Any) -> Any:
        try:
            simple = descriptor.file_annotation is None and descriptor.annotation in PASSED_THROUGH
        except TypeError:  # an unhashable annotation: not one of ours
            simple = False
        if simple:
            return AsGivenOrTypers(
                parameter_info=descriptor.parameter_info,
                annotation=descriptor.annotation,
                descriptor=descriptor,
            )
        return typer_build(descriptor)

    build.epctl_fast_path = True  # type: ignore[attr-defined]
    build.typers_own = typer_build  # type: ignore[attr-defined]
    core.build_runtime_param = build
