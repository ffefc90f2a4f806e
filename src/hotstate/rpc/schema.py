"""A strict, generic mapping between registered frozen dataclasses and msgpack.

The wire codec and the record codec each own a `TypeRegistry`; nothing is ever pickled. A registered
dataclass travels as `[type_id, version, [field values in field order]]`; a dataclass that is only used as
a field (not through a union) travels as its bare field list, and a field typed as a union of dataclasses
carries the tagged form so the reader knows which one it got.

Supported field types (resolved with `typing.get_type_hints`): int, float, bool, str, bytes, None,
`X | None`, IntEnum subclasses, frozen dataclasses, `tuple[X, ...]`, fixed `tuple[X, Y]`, `frozenset[X]`,
`dict[str, X]` and unions of registered dataclasses. Anything else is refused at registration.

Decoding trusts nothing: every value's type is checked exactly (bool is not an int, an int is not a float
or bytes), list lengths must match, unknown type ids and versions newer than ours are refused, and every
problem surfaces as a `DecodeError` naming the type and the field path, never a TypeError from deep inside.

Evolution: a writer may omit trailing fields that have defaults. So a field is added by appending it with
a default and bumping the version; readers of the new version accept the old shorter lists, and readers
of the old version refuse the new version instead of misreading it.

Speed: this sits on the hot path of Raft fetches, so each dataclass gets an encoder and a decoder
generated at registration (as `dataclasses` generates `__init__`) that check primitive fields inline and
call prepared converters for the rest. When the fast path meets anything unusual it hands the value to a
slow path that walks it field by field and reports exactly where it went wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

__all__ = [
    "MAX_WIRE_INT",
    "MIN_WIRE_INT",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "SchemaError",
    "TypeRegistry",
]

# What msgpack can carry; bigger Python ints fail in packb, so the encoder checks them itself.
MIN_WIRE_INT = -(2**63)
MAX_WIRE_INT = 2**64 - 1
# Generous defaults for `decode(bytes)`; the frame layer bounds whole frames.
_DEFAULT_MAX_DECODE_BYTES = 64 * 1024 * 1024

_Conv = Callable[[Any], Any]


class CodecError(ValueError):
    """A value that cannot be encoded or bytes that cannot be decoded."""


class EncodeError(CodecError):
    """An object the registry cannot encode: unregistered type, or a field holding the wrong type."""


class DecodeError(CodecError):
    """Bytes or a wire value that do not decode to a registered type; the message names type and field."""


class SchemaError(TypeError):
    """A class or annotation the registry cannot handle (a programming error found at registration)."""


class _Invalid(Exception):
    """Raised inside converters; the path grows (innermost first) as it travels out, then becomes an error."""

    __slots__ = ("path", "reason")

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def _join_path(segments: list[str]) -> str:
    """Segments innermost first: field names, "[i]" indexes and "<Type>" for tagged (union) values."""
    out = ""
    for segment in reversed(segments):
        if not out and segment.startswith("<"):
            out = segment[1:-1]  # the outermost type names the whole path
        elif not out or segment.startswith(("[", "<")):
            out += segment
        else:
            out += "." + segment
    return out


def _describe(value: object) -> str:
    """A short, safe description of a received value for an error message (never a huge repr)."""
    if value is None or type(value) in (bool, int, float):
        return f"{type(value).__name__} {value!r}"
    if type(value) is str:
        text = value if len(value) <= 40 else value[:40] + "..."
        return f"str {text!r}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{type(value).__name__} of length {len(value)}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    if isinstance(value, dict):
        return f"map of {len(value)} entries"
    return type(value).__name__


def _want(expected: str, value: object) -> _Invalid:
    return _Invalid(f"expected {expected}, got {_describe(value)}")


def _type_name(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


@dataclasses.dataclass(slots=True)
class _Converter:
    """How one annotated type goes to and from the wire.

    `enc_check` / `dec_check` are expression templates over `{x}`: when true, the value passes unchanged,
    so generated code can test it inline and skip a call. They are sufficient, not necessary: when false,
    `enc` / `dec` run and either convert the value or raise.
    """

    name: str
    enc: _Conv
    dec: _Conv
    enc_check: str | None = None
    dec_check: str | None = None
    hashable: bool = True
    # A fixed tuple's check of a whole decoded array (the array then needs only tuple()): a tuple of them
    # converts in C, not with a call per item.
    dec_array_check: Callable[[Any], bool] | None = None


def _exactly(tp: type, name: str) -> _Conv:
    """The conversion that passes a value of exactly type `tp` (not a subclass, so no bool for an int)."""

    def convert(x: Any) -> Any:
        if type(x) is tp:
            return x
        raise _want(name, x)

    return convert


def _int_conv() -> _Converter:
    def enc(x: Any) -> Any:
        if isinstance(x, bool) or not isinstance(x, int):
            raise _want("int", x)
        if not MIN_WIRE_INT <= x <= MAX_WIRE_INT:
            raise _Invalid(f"int {x} does not fit in 64 bits")
        return int(x)

    # Out-of-range ints are left to packb's OverflowError on the fast path (reported as EncodeError).
    return _Converter("int", enc, _exactly(int, "int"), "type({x}) is int", "type({x}) is int")


def _float_conv() -> _Converter:
    def enc(x: Any) -> Any:
        if isinstance(x, float):
            return float(x)
        if isinstance(x, int) and not isinstance(x, bool):
            # `x: float = 1` is legal Python; the wire form is always a float so readers can stay strict.
            return float(x)
        raise _want("float", x)

    return _Converter("float", enc, _exactly(float, "float"), "type({x}) is float", "type({x}) is float")


def _exact_conv(tp: type, name: str) -> _Converter:
    exact = _exactly(tp, name)
    return _Converter(name, exact, exact, f"type({{x}}) is {name}", f"type({{x}}) is {name}")


def _bytes_conv() -> _Converter:
    def enc(x: Any) -> Any:
        if isinstance(x, bytes):
            return bytes(x)
        raise _want("bytes", x)

    return _Converter("bytes", enc, _exactly(bytes, "bytes"), "type({x}) is bytes", "type({x}) is bytes")


def _none_conv() -> _Converter:
    def enc(x: Any) -> Any:
        if x is None:
            return x
        raise _want("None", x)

    def dec(x: Any) -> Any:
        if x is None:
            return x
        raise _want("nil", x)

    return _Converter("None", enc, dec, "{x} is None", "{x} is None")


def _enum_conv(cls: type[enum.IntEnum], key: str) -> _Converter:
    """`key` is the name generated code uses for `cls` (unique per registry, unlike class names)."""
    members = {int(m): m for m in cls}
    name = cls.__name__

    def dec(x: Any) -> Any:
        if type(x) is int:
            member = members.get(x)
            if member is not None:
                return member
            raise _Invalid(f"{x} is not a valid {name}")
        raise _want(f"int ({name})", x)

    # A member packs as its int value (msgpack packs int subclasses as ints), so it passes unchanged.
    return _Converter(name, _exactly(cls, name), dec, f"type({{x}}) is {key}", None)


def _optional_conv(inner: _Converter) -> _Converter:
    inner_enc, inner_dec = inner.enc, inner.dec

    def enc(x: Any) -> Any:
        return None if x is None else inner_enc(x)

    def dec(x: Any) -> Any:
        return None if x is None else inner_dec(x)

    enc_check = f"({{x}} is None or {inner.enc_check})" if inner.enc_check else None
    dec_check = f"({{x}} is None or {inner.dec_check})" if inner.dec_check else None
    return _Converter(f"{inner.name} | None", enc, dec, enc_check, dec_check, inner.hashable)


def _check_fn(template: str | None, namespace: dict[str, Any]) -> Callable[[Any], bool] | None:
    """Compile an inline check template into a predicate (for element checks in containers)."""
    if template is None:
        return None
    source = f"def check(x):\n    return {template.format(x='x')}\n"
    scope = dict(namespace)
    exec(source, scope)
    check: Callable[[Any], bool] = scope["check"]
    return check


def _locate(items: Any, convert: _Conv) -> _Invalid:
    """Re-run a container's elements one by one to find (and index) the one that failed."""
    for i, item in enumerate(items):
        try:
            convert(item)
        except _Invalid as e:
            e.path.append(f"[{i}]")
            return e
    return _Invalid("inconsistent element conversion")  # unreachable unless a converter is flaky


# Item checks that are an exact type test: a whole tuple of such items is checked in C (`_all_of_type`), not
# with a call per item (a metadata snapshot's columns hold millions of ints).
_EXACT_CHECKS: dict[str | None, type] = {f"type({{x}}) is {t.__name__}": t for t in (int, str, bytes, float)}


def _all_of_type(kind: type) -> Callable[[Any], bool]:
    allowed = frozenset((kind,))

    def check(items: Any) -> bool:
        return set(map(type, items)) <= allowed

    return check


def _items_check(kind: type | None, item_ok: Callable[[Any], bool] | None) -> Callable[[Any], bool] | None:
    """A check that every item of an array passes unchanged: in C for an exact type, else per item."""
    if kind is not None:
        return _all_of_type(kind)
    if item_ok is not None:
        return lambda items: all(map(item_ok, items))
    return None


def _tuple_conv(inner: _Converter, namespace: dict[str, Any]) -> _Converter:
    inner_enc, inner_dec = inner.enc, inner.dec
    enc_item_ok = _check_fn(inner.enc_check, namespace)
    dec_item_ok = _check_fn(inner.dec_check, namespace)
    enc_kind = _EXACT_CHECKS.get(inner.enc_check)
    dec_kind = _EXACT_CHECKS.get(inner.dec_check)
    enc_all = _items_check(enc_kind, enc_item_ok)
    dec_all = _items_check(dec_kind, dec_item_ok)
    name = f"tuple[{inner.name}, ...]"

    def enc(x: Any) -> Any:
        if not isinstance(x, tuple):
            raise _want("tuple", x)
        if enc_all is not None and enc_all(x):
            return x  # msgpack packs tuples as arrays: nothing to copy
        try:
            return [inner_enc(item) for item in x]
        except _Invalid:
            raise _locate(x, inner_enc) from None

    array_ok = inner.dec_array_check

    def dec(x: Any) -> Any:
        if type(x) is not list:
            raise _want("array", x)
        if dec_all is not None and dec_all(x):
            return tuple(x)
        if array_ok is not None and all(map(array_ok, x)):
            return tuple(map(tuple, x))
        try:
            return tuple([inner_dec(item) for item in x])
        except _Invalid:
            raise _locate(x, inner_dec) from None

    return _Converter(name, enc, dec, None, None, inner.hashable)


def _element_checks(templates: list[str | None]) -> str | None:
    """One check template over a fixed tuple's elements `{x}[0]`, `{x}[1]`, ...; None if one has none."""
    present = [t for t in templates if t is not None]
    if len(present) != len(templates):
        return None
    return " and ".join(t.format(x=f"{{x}}[{i}]") for i, t in enumerate(present))


def _convert_each(converts: list[_Conv], items: Sequence[Any]) -> list[Any]:
    """A fixed tuple's elements, each by its own converter (encoding or decoding alike); a failure names
    the element's index in its path."""
    out = []
    for i, (convert, item) in enumerate(zip(converts, items, strict=True)):
        try:
            out.append(convert(item))
        except _Invalid as e:
            e.path.append(f"[{i}]")
            raise
    return out


def _fixed_tuple_conv(inners: list[_Converter], namespace: dict[str, Any]) -> _Converter:
    encs = [c.enc for c in inners]
    decs = [c.dec for c in inners]
    n = len(inners)
    name = f"tuple[{', '.join(c.name for c in inners)}]"
    # Items such as a scan's (key, row) pairs, by the thousand: when every element has an inline check,
    # a tuple that passes them goes out as it is and an array that passes them becomes a tuple at once.
    enc_check = dec_whole = None
    elements = _element_checks([c.enc_check for c in inners])
    if elements is not None:
        enc_check = f"(type({{x}}) is tuple and len({{x}}) == {n} and {elements})"
    elements = _element_checks([c.dec_check for c in inners])
    if elements is not None:
        dec_whole = _check_fn(f"type({{x}}) is list and len({{x}}) == {n} and {elements}", namespace)

    def enc(x: Any) -> Any:
        if not isinstance(x, tuple) or len(x) != n:
            raise _want(f"tuple of {n}", x)
        return _convert_each(encs, x)

    def dec(x: Any) -> Any:
        if dec_whole is not None and dec_whole(x):
            return tuple(x)
        if type(x) is not list or len(x) != n:
            raise _want(f"array of {n}", x)
        return tuple(_convert_each(decs, x))

    return _Converter(name, enc, dec, enc_check, None, all(c.hashable for c in inners), dec_whole)


def _sorted_if_possible(items: list[Any]) -> list[Any]:
    try:
        # Sorted so a set encodes to the same bytes every time (records are checksummed and compared).
        return sorted(items)
    except TypeError:
        return items


def _frozenset_conv(inner: _Converter) -> _Converter:
    inner_enc, inner_dec = inner.enc, inner.dec
    name = f"frozenset[{inner.name}]"

    def enc(x: Any) -> Any:
        if not isinstance(x, frozenset):
            raise _want("frozenset", x)
        items = _sorted_if_possible(list(x))
        try:
            return [inner_enc(item) for item in items]
        except _Invalid:
            raise _locate(items, inner_enc) from None

    def dec(x: Any) -> Any:
        if type(x) is not list:
            raise _want("array", x)
        try:
            items = [inner_dec(item) for item in x]
        except _Invalid:
            raise _locate(x, inner_dec) from None
        try:
            out = frozenset(items)
        except TypeError as e:
            # A frozen dataclass is hashable only if its fields are (a dict field is not).
            raise _Invalid(f"set elements are not hashable: {e}") from None
        if len(out) != len(items):
            raise _Invalid("duplicate elements in a set")
        return out

    return _Converter(name, enc, dec, None, None, True)


def _dict_conv(inner: _Converter, namespace: dict[str, Any]) -> _Converter:
    inner_enc, inner_dec = inner.enc, inner.dec
    enc_ok = _check_fn(inner.enc_check, namespace)
    dec_ok = _check_fn(inner.dec_check, namespace)
    name = f"dict[str, {inner.name}]"

    def enc(x: Any) -> Any:
        if not isinstance(x, dict):
            raise _want("dict", x)
        for key in x:
            if type(key) is not str:
                raise _Invalid(f"expected str keys, got {_describe(key)}")
        if enc_ok is not None and all(map(enc_ok, x.values())):
            return x
        out = {}
        for key, value in x.items():
            try:
                out[key] = inner_enc(value)
            except _Invalid as e:
                e.path.append(f"[{key!r}]")
                raise
        return out

    def dec(x: Any) -> Any:
        if type(x) is not dict:
            raise _want("map", x)
        for key in x:
            if type(key) is not str:
                raise _Invalid(f"expected str keys, got {_describe(key)}")
        if dec_ok is not None and all(map(dec_ok, x.values())):
            return dict(x)
        out = {}
        for key, value in x.items():
            try:
                out[key] = inner_dec(value)
            except _Invalid as e:
                e.path.append(f"[{key[:40]!r}]")
                raise
        return out

    return _Converter(name, enc, dec, None, None, False)


@dataclasses.dataclass(slots=True)
class _Field:
    name: str
    conv: _Converter
    has_default: bool
    kw_only: bool


def _field_lines(i: int, source: str, check: str | None, convert: str) -> list[str]:
    """Generated lines that read field `i` from `source` into x{i}, then call `convert` on it unless the
    inline `check` passes it unchanged."""
    read = f"        x{i} = {source}"
    if check:
        return [read, f"        if not {check.format(x=f'x{i}')}: x{i} = {convert}(x{i})"]
    return [read, f"        x{i} = {convert}(x{i})"]


class _Struct:
    """Encoder and decoder of one dataclass's field list (`[v0, v1, ...]`)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: list[_Field] = []
        # Filled by `compile`; until then (while a recursive type is being built) the lazy wrappers wait.
        self.encode: _Conv = self._not_ready
        self.decode: _Conv = self._not_ready
        self.min_fields = 0

    def _not_ready(self, x: Any) -> Any:
        raise _Invalid(f"{self.cls.__name__} is still being compiled")

    def compile(self, names: dict[str, Any]) -> None:
        """Generate the fast functions; `names` binds the enum classes the checks refer to."""
        fields = self.fields
        n = len(fields)
        # Trailing fields with defaults may be missing (written by an older version).
        required = n
        while required > 0 and fields[required - 1].has_default:
            required -= 1
        self.min_fields = required
        namespace: dict[str, Any] = dict(names)
        namespace.update(_cls=self.cls, _Invalid=_Invalid)
        for i, f in enumerate(fields):
            namespace[f"_e{i}"] = f.conv.enc
            namespace[f"_d{i}"] = f.conv.dec
        namespace["_slow_encode"] = self._slow_encode
        namespace["_slow_decode"] = self._slow_decode

        enc_lines = ["def encode(o):", "    if type(o) is not _cls:", "        return _slow_encode(o)"]
        if n:
            enc_lines.append("    try:")
            for i, f in enumerate(fields):
                enc_lines += _field_lines(i, f"o.{f.name}", f.conv.enc_check, f"_e{i}")
            enc_lines += ["    except _Invalid:", "        return _slow_encode(o)"]
        enc_lines.append(f"    return [{', '.join(f'x{i}' for i in range(n))}]")

        dec_lines = [
            "def decode(v):",
            f"    if type(v) is not list or len(v) != {n}:",
            "        return _slow_decode(v)",
        ]
        if n:
            dec_lines.append("    try:")
            for i, f in enumerate(fields):
                dec_lines += _field_lines(i, f"v[{i}]", f.conv.dec_check, f"_d{i}")
            args = ", ".join(f"{f.name}=x{i}" if f.kw_only else f"x{i}" for i, f in enumerate(fields))
            dec_lines += [
                f"        return _cls({args})",
                # Any failure (including __post_init__ refusing the values) is re-derived by the slow
                # path, which knows which field failed and reports it.
                "    except Exception:",
                "        return _slow_decode(v)",
            ]
        else:
            dec_lines.append("    return _cls()")
        source = "\n".join(enc_lines) + "\n\n" + "\n".join(dec_lines) + "\n"
        exec(compile(source, f"<hotstate.rpc.schema {self.cls.__qualname__}>", "exec"), namespace)
        self.encode = namespace["encode"]
        self.decode = namespace["decode"]

    def _slow_encode(self, o: Any) -> Any:
        if type(o) is not self.cls:
            raise _want(self.cls.__name__, o)
        out = []
        for f in self.fields:
            try:
                value = getattr(o, f.name)
                out.append(f.conv.enc(value))
            except _Invalid as e:
                e.path.append(f.name)
                raise
        return out

    def _slow_decode(self, v: Any) -> Any:
        name = self.cls.__name__
        n = len(self.fields)
        if type(v) is not list:
            raise _want(f"a field array for {name}", v)
        if len(v) > n:
            raise _Invalid(f"{len(v)} fields but {name} has {n} (extra fields)")
        if len(v) < self.min_fields:
            missing = self.fields[len(v)].name
            raise _Invalid(f"{len(v)} fields but {name} has {n}: missing field {missing!r}")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for f, item in zip(self.fields, v, strict=False):
            try:
                value = f.conv.dec(item)
            except _Invalid as e:
                e.path.append(f.name)
                raise
            if f.kw_only:
                kwargs[f.name] = value
            else:
                args.append(value)
        try:
            return self.cls(*args, **kwargs)
        except Exception as e:
            # A __post_init__ may validate; its refusal is a property of the received data.
            raise _Invalid(f"{name} refused the values: {type(e).__name__}: {e}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class _Registration:
    type_id: int
    cls: type
    version: int
    struct: _Struct


class TypeRegistry:
    """Registered frozen dataclasses <-> msgpack. One instance per codec (wire messages, log records).

    >>> registry = TypeRegistry("wire")
    >>> registry.register(1, Vote)
    >>> registry.decode(registry.encode(vote)) == vote
    """

    def __init__(self, name: str = "registry", *, max_decode_bytes: int = _DEFAULT_MAX_DECODE_BYTES) -> None:
        self.name = name
        self.max_decode_bytes = max_decode_bytes
        self._by_id: dict[int, _Registration] = {}
        self._by_class: dict[type, _Registration] = {}
        self._structs: dict[type, _Struct] = {}
        self._building: set[type] = set()
        # Enum classes referenced by generated code, by the name the check templates use for them.
        self._enum_keys: dict[type, str] = {}
        self._enums: dict[str, type] = {}

    # -- registration -------------------------------------------------------------------------------

    def register(self, type_id: int, cls: type, *, version: int = 1) -> None:
        """Register `cls` (a frozen dataclass) under `type_id`, at schema `version` (>= 1).

        Raises `SchemaError` for a duplicate id or class, a non-frozen class or an unsupported field type.
        """
        if type(type_id) is not int or not 0 <= type_id <= 0xFFFF_FFFF:
            raise SchemaError(f"type id must be an int in [0, 2**32), got {type_id!r}")
        if type(version) is not int or version < 1:
            raise SchemaError(f"version must be an int >= 1, got {version!r}")
        if type_id in self._by_id:
            other = self._by_id[type_id].cls.__name__
            raise SchemaError(f"type id {type_id} is already registered to {other} in {self.name}")
        if cls in self._by_class:
            raise SchemaError(
                f"{cls.__name__} is already registered in {self.name} "
                f"as type id {self._by_class[cls].type_id}"
            )
        struct = self._struct(cls)
        registration = _Registration(type_id, cls, version, struct)
        self._by_id[type_id] = registration
        self._by_class[cls] = registration

    def type_id(self, cls: type) -> int:
        """The type id `cls` is registered under (KeyError if it is not)."""
        return self._by_class[cls].type_id

    def registered(self) -> dict[int, type]:
        """Type id -> class, for introspection and tests."""
        return {tid: r.cls for tid, r in self._by_id.items()}

    def _struct(self, cls: object) -> _Struct:
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            raise SchemaError(f"{_type_name(cls)} is not a dataclass")
        existing = self._structs.get(cls)
        if existing is not None:
            return existing
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise SchemaError(f"{cls.__name__} must be a frozen dataclass (@dataclass(frozen=True))")
        try:
            hints = typing.get_type_hints(cls)
        except Exception as e:
            raise SchemaError(f"cannot resolve the annotations of {cls.__qualname__}: {e}") from e
        struct = _Struct(cls)
        self._structs[cls] = struct
        self._building.add(cls)
        try:
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue  # computed in __post_init__; not part of the wire form
                try:
                    conv = self._converter(hints[f.name])
                except SchemaError as e:
                    raise SchemaError(f"{cls.__name__}.{f.name}: {e}") from None
                has_default = (
                    f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                )
                struct.fields.append(_Field(f.name, conv, has_default, bool(f.kw_only)))
            struct.compile(self._enums)
        except BaseException:
            del self._structs[cls]
            raise
        finally:
            self._building.discard(cls)
        return struct

    def _converter(self, tp: Any) -> _Converter:
        if tp is int:
            return _int_conv()
        if tp is float:
            return _float_conv()
        if tp is bool:
            return _exact_conv(bool, "bool")
        if tp is str:
            return _exact_conv(str, "str")
        if tp is bytes:
            return _bytes_conv()
        if tp is None or tp is type(None):
            return _none_conv()
        if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
            key = self._enum_keys.get(tp)
            if key is None:
                key = f"_enum{len(self._enum_keys)}"
                self._enum_keys[tp] = key
                self._enums[key] = tp
            return _enum_conv(tp, key)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            raise SchemaError(f"{tp.__name__}: only IntEnum enums are supported")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self._struct_conv(tp)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        namespace: dict[str, Any] = dict(self._enums)
        if origin is typing.Union or origin is types.UnionType:
            return self._union_conv(tp, args)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return _tuple_conv(self._converter(args[0]), namespace)
            if not args or args == ((),):
                raise SchemaError("empty tuple types are not supported")
            return _fixed_tuple_conv([self._converter(a) for a in args], namespace)
        if origin is frozenset:
            inner = self._converter(args[0])
            if not inner.hashable:
                raise SchemaError(f"frozenset elements of type {inner.name} are not hashable")
            return _frozenset_conv(inner)
        if origin is dict:
            if args[0] is not str:
                raise SchemaError(
                    f"dict keys must be str (msgpack strict map keys), got {_type_name(args[0])}"
                )
            return _dict_conv(self._converter(args[1]), namespace)
        raise SchemaError(f"unsupported field type {_type_name(tp)}")

    def _struct_conv(self, cls: type) -> _Converter:
        struct = self._struct(cls)
        name = cls.__name__
        if cls in self._building:
            # A recursive type: the struct is not compiled yet, so look its functions up at call time.
            def enc(x: Any) -> Any:
                return struct.encode(x)

            def dec(x: Any) -> Any:
                return struct.decode(x)

            return _Converter(name, enc, dec, None, None, _is_hashable(cls))
        return _Converter(name, struct.encode, struct.decode, None, None, _is_hashable(cls))

    def _union_conv(self, tp: Any, args: tuple[Any, ...]) -> _Converter:
        members = [a for a in args if a is not type(None)]
        optional = len(members) != len(args)
        if len(members) == 1:
            inner = self._converter(members[0])
            return _optional_conv(inner) if optional else inner
        for member in members:
            if not (isinstance(member, type) and dataclasses.is_dataclass(member)):
                raise SchemaError(
                    f"unsupported union {_type_name(tp)}: unions may only mix dataclasses (and None)"
                )
        allowed = frozenset(members)
        name = " | ".join(m.__name__ for m in members)
        registry = self

        # Members are looked up at call time, so a union may name classes registered later.
        def enc(x: Any) -> Any:
            if type(x) not in allowed:
                raise _want(name, x)
            return registry._tagged_encode(x)

        def dec(x: Any) -> Any:
            value = registry._tagged_decode(x)
            if type(value) not in allowed:
                raise _Invalid(f"expected {name}, got {type(value).__name__}")
            return value

        conv = _Converter(name, enc, dec, None, None, all(_is_hashable(m) for m in members))
        return _optional_conv(conv) if optional else conv

    # -- encoding -----------------------------------------------------------------------------------

    def _tagged_encode(self, obj: Any) -> list[Any]:
        registration = self._by_class.get(type(obj))
        if registration is None:
            raise _Invalid(f"{type(obj).__name__} is not registered in {self.name}")
        try:
            fields = registration.struct.encode(obj)
        except _Invalid as e:
            e.path.append(f"<{registration.cls.__name__}>")
            raise
        return [registration.type_id, registration.version, fields]

    def to_wire(self, obj: object) -> list[Any]:
        """The msgpack-ready form `[type_id, version, [fields]]` of a registered object (for embedding).

        Raises `EncodeError` for an unregistered type or a field holding a value of the wrong type.
        """
        try:
            return self._tagged_encode(obj)
        except _Invalid as e:
            raise EncodeError(f"cannot encode {_where(e, type(obj).__name__)}: {e.reason}") from None

    def encode(self, obj: object) -> bytes:
        """msgpack bytes of a registered object. Raises `EncodeError`."""
        wire = self.to_wire(obj)
        try:
            return msgpack.packb(wire, use_bin_type=True)
        except OverflowError:
            # The fast path leaves the 64-bit range check to msgpack (it is a rare programming error).
            raise EncodeError(f"cannot encode {type(obj).__name__}: an int does not fit in 64 bits") from None
        except (ValueError, TypeError) as e:
            raise EncodeError(f"cannot encode {type(obj).__name__}: {e}") from None

    # -- decoding -----------------------------------------------------------------------------------

    def _tagged_decode(self, value: Any) -> Any:
        if type(value) is not list or len(value) != 3:
            raise _want("[type_id, version, fields]", value)
        type_id, version, fields = value
        if type(type_id) is not int:
            raise _Invalid(f"type id: expected int, got {_describe(type_id)}")
        registration = self._by_id.get(type_id)
        if registration is None:
            raise _Invalid(f"unknown type id {type_id} in {self.name}")
        if type(version) is not int or not 1 <= version <= registration.version:
            if type(version) is not int:
                problem = _want("an int version", version)
            elif version > registration.version:
                problem = _Invalid(
                    f"version {version} is newer than the known version {registration.version}"
                )
            else:
                problem = _Invalid(f"version {version} is invalid (versions start at 1)")
            problem.path.append(f"<{registration.cls.__name__}>")
            raise problem
        try:
            return registration.struct.decode(fields)
        except _Invalid as e:
            e.path.append(f"<{registration.cls.__name__}>")
            raise

    def from_wire(self, value: object) -> object:
        """The object a `to_wire` form (as msgpack returned it) stands for. Raises `DecodeError`."""
        try:
            return self._tagged_decode(value)
        except _Invalid as e:
            raise DecodeError(f"cannot decode {_where(e, 'message')}: {e.reason}") from None

    def decode(self, data: bytes | bytearray | memoryview) -> object:
        """The object encoded in `data` (one msgpack value, nothing after it). Raises `DecodeError`."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DecodeError(f"cannot decode {type(data).__name__}: expected bytes")
        n = len(data)
        if n > self.max_decode_bytes:
            raise DecodeError(f"cannot decode {n} bytes: over the limit of {self.max_decode_bytes}")
        try:
            value = unpack_strict(data)
        except Exception as e:
            raise DecodeError(f"not valid msgpack: {type(e).__name__}: {e}") from None
        return self.from_wire(value)


def unpack_strict(data: bytes | bytearray | memoryview) -> Any:
    """msgpack -> Python with str for str, bytes for bin, lists for arrays, str/bytes map keys only.

    The length limits are the input's own length: no element can claim more than the bytes that are there,
    so a forged length cannot make the unpacker allocate ahead of the data.
    """
    n = len(data)
    return msgpack.unpackb(
        data,
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n // 2,
        max_ext_len=n,
    )


def _is_hashable(cls: type) -> bool:
    return getattr(cls, "__hash__", None) is not None


def _where(e: _Invalid, fallback: str) -> str:
    """ "FetchResponse.entries[3].data" from a path collected innermost first; `fallback` when empty."""
    return _join_path(e.path) if e.path else fallback
