"""The one base of the failures on the engines' side that a job records as its error (`JobError`): a
call to an agent or to a vLLM server that failed, engines that could not be launched, a change the
engines' reports do not allow planning. Each carries a machine-readable (kebab-case) `type`, a message
and, when one engine is to blame, its id; nothing about HTTP or a launcher's own terms."""

from __future__ import annotations


class EngineFault(Exception):
    """An engine-side failure: `type` (kebab-case), `message`, and the engine to blame (or None)."""

    type: str = "engine-fault"

    def __init__(self, message: str, engine_id: str | None = None, *, type_: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.engine_id = engine_id
        if type_ is not None:
            self.type = type_
