"""API shapes read off table rows, with no hand-written copy of each column (one that forgets a new
column): `Shape.model_validate(row)` reads each field from the row's attribute of the same name
(pydantic's `from_attributes`), a renamed column through the field's `validation_alias`, a value the
shape computes from the row through its `derived(row)`; what the row does not hold at all is given by
the caller, `Shape.of(row, deployment=name)`.

A shape validated from anything but a row (a dict: parsed JSON) reads it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator
from sqlmodel import SQLModel


class RowView:
    """A row seen with some attributes added or replaced (what `from_attributes` reads)."""

    __slots__ = ("_row", "_values")
    _row: Any
    _values: dict[str, Any]

    def __init__(self, row: Any, values: Mapping[str, Any]) -> None:
        if isinstance(row, RowView):  # values given earlier win over later ones
            values, row = {**values, **row._values}, row._row
        self._row = row
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            return getattr(self._row, name)


class RowShape(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def derived(cls, row: Any) -> Mapping[str, Any]:
        """The fields this shape computes from the row (each wins over a row attribute of its name)."""
        return {}

    @classmethod
    def of(cls, row: Any, **given: Any) -> Self:
        """The shape of `row`, with `given` the fields the row does not hold."""
        return cls.model_validate(RowView(row, given))

    @model_validator(mode="before")
    @classmethod
    def _read_row(cls, data: Any) -> Any:
        if not isinstance(data, SQLModel | RowView):
            return data
        derived = cls.derived(data)
        return RowView(data, derived) if derived else data
