"""Query answers as Arrow tables (and through them pandas DataFrames), typed as the table declares its
columns: key columns by their SQL names (STRING, BIGINT, DOUBLE, BOOLEAN, BYTES, TIMESTAMP), value
columns by Spark's (bigint, int, double, timestamp, timestamp_ntz, date, decimal(p,s), binary, ...).

pyarrow is imported here only, when a caller asks for a table, so that the client itself needs neither
pyarrow nor pandas (they come with `hotstate[spark]`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

# JSON has no numbers for these: answers carry them as strings (as ksqlDB's Jackson writer does).
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class FrameError(ValueError):
    """An answer's values do not fit the types its table declares (e.g. a BYTES key that is not base64)."""


def arrow_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], types: Mapping[str, str]) -> pa.Table:
    """`types`: column -> declared type name; a column without one (or of a nested type) is inferred."""
    pa = _pyarrow()
    conversions = _conversions(pa)
    arrays = []
    fields = []
    for index, name in enumerate(columns):
        values = [row[index] for row in rows]
        declared = types.get(name, "").strip().lower()
        decimal_type = _DECIMAL.fullmatch(declared)
        known = conversions.get(declared)
        if decimal_type is not None:
            precision, scale = int(decimal_type[1]), int(decimal_type[2])
            exact = [None if v is None else _decimal(v) for v in values]
            array = pa.array(exact, type=pa.decimal128(precision, scale))
        elif known is not None:
            arrow_type, convert = known
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


def _conversions(pa: Any) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
    """Lower-case type name -> (Arrow type, JSON value -> Python value of it)."""
    return {
        "string": (pa.string(), str),
        "bigint": (pa.int64(), int),
        "int": (pa.int32(), int),
        "smallint": (pa.int16(), int),
        "tinyint": (pa.int8(), int),
        "double": (pa.float64(), _float),
        "float": (pa.float32(), _float),
        "boolean": (pa.bool_(), bool),
        "bytes": (pa.binary(), _bytes),
        "binary": (pa.binary(), _bytes),
        # Keys are stored as UTC microseconds and come back naive, in UTC (protocol/keys.py); Spark's
        # timestamp is an instant too (its values are written as they are, with or without an offset).
        "timestamp": (pa.timestamp("us", tz="UTC"), _timestamp),
        "timestamp_ntz": (pa.timestamp("us"), _wall_time),
        "date": (pa.date32(), _date),
    }


_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def _decimal(value: Any) -> decimal.Decimal:
    try:
        return decimal.Decimal(str(value))
    except decimal.InvalidOperation as error:
        raise FrameError(f"a decimal value {value!r} is not a number") from error


def _wall_time(value: Any) -> dt.datetime:
    parsed = _parsed(value, "timestamp_ntz")
    return parsed if parsed.tzinfo is None else parsed.astimezone(dt.UTC).replace(tzinfo=None)


def _date(value: Any) -> dt.date:
    try:
        return dt.date.fromisoformat(str(value)[:10])
    except ValueError as error:
        raise FrameError(f"a date value {value!r} is not an ISO-8601 date: {error}") from error


def _float(value: Any) -> float:
    return NON_FINITE[value] if isinstance(value, str) else float(value)


def _bytes(value: Any) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError) as error:
        raise FrameError(f"a bytes value {value!r} is not base64: {error}") from error


def _timestamp(value: Any) -> dt.datetime:
    parsed = _parsed(value, "timestamp")
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def _parsed(value: Any, kind: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(value)
    except (TypeError, ValueError) as error:
        raise FrameError(f"a {kind} value {value!r} is not an ISO-8601 time: {error}") from error


def _numbers_again(values: list[Any]) -> list[Any]:
    """A column of numbers with "NaN"/"Infinity"/"-Infinity" among them as floats; any other as it is."""
    specials = [v for v in values if isinstance(v, str)]
    if not specials or any(v not in NON_FINITE for v in specials):
        return values
    numbers = any(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numbers and len(specials) < len(values) - values.count(None):
        return values
    return [NON_FINITE[v] if isinstance(v, str) else v for v in values]
