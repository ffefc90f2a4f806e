"""Query answers as Arrow tables (and through them pandas DataFrames), typed from the table's key.

pyarrow is imported here only, when a caller asks for a table, so that the client itself needs neither
pyarrow nor pandas (they come with `hotstate[spark]`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

# JSON has no numbers for these: answers carry them as strings (as ksqlDB's Jackson writer does).
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class FrameError(ValueError):
    """An answer's values do not fit the types its table declares (e.g. a BYTES key that is not base64)."""


def arrow_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], key_columns: Mapping[str, str]
) -> pa.Table:
    pa = _pyarrow()
    arrays = []
    fields = []
    for index, name in enumerate(columns):
        values = [row[index] for row in rows]
        key_type = key_columns.get(name)
        if key_type is not None:
            arrow_type, convert = _key_conversions(pa)[key_type]
            array = pa.array([None if v is None else convert(v) for v in values], type=arrow_type)
        else:
            array = pa.array(_numbers_again(values))
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as error:
        raise ImportError(
            "to_arrow() and to_pandas() need pyarrow (and pandas for to_pandas): "
            "pip install 'hotstate[spark]', or pip install pyarrow pandas"
        ) from error
    return pyarrow


def _key_conversions(pa: Any) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
    return {
        "STRING": (pa.string(), str),
        "BIGINT": (pa.int64(), int),
        "DOUBLE": (pa.float64(), _float),
        "BOOLEAN": (pa.bool_(), bool),
        "BYTES": (pa.binary(), _bytes),
        # Keys are stored as UTC microseconds and come back naive, in UTC (replica/keys.py).
        "TIMESTAMP": (pa.timestamp("us", tz="UTC"), _timestamp),
    }


def _float(value: Any) -> float:
    return NON_FINITE[value] if isinstance(value, str) else float(value)


def _bytes(value: Any) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError) as error:
        raise FrameError(f"a BYTES key {value!r} is not base64: {error}") from error


def _timestamp(value: Any) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError) as error:
        raise FrameError(f"a TIMESTAMP key {value!r} is not an ISO-8601 time: {error}") from error
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def _numbers_again(values: list[Any]) -> list[Any]:
    """A column of numbers with "NaN"/"Infinity"/"-Infinity" among them as floats; any other as it is."""
    specials = [v for v in values if isinstance(v, str)]
    if not specials or any(v not in NON_FINITE for v in specials):
        return values
    numbers = any(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numbers and len(specials) < len(values) - values.count(None):
        return values
    return [NON_FINITE[v] if isinstance(v, str) else v for v in values]
