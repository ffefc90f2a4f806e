"""TypeRegistry: round trips (hypothesis, including the real Raft messages), strict decoding, registration."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.log.divergence import DivergingEpoch
from hotstate.raft import messages as raft
from hotstate.raft.records import Entry, EntryKind, SnapshotId
from hotstate.rpc import DecodeError, EncodeError, SchemaError, TypeRegistry
from hotstate.rpc.schema import unpack_strict

from .helpers import RAFT_TYPES, raft_registry, strategy_for


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Circle:
    center: Point
    radius: float


@dataclass(frozen=True, slots=True)
class Square:
    corner: Point
    side: float
    color: Color = Color.RED


@dataclass(frozen=True)
class Everything:
    """Every supported field type once (not slotted, to cover plain frozen dataclasses too)."""

    i: int
    f: float
    b: bool
    s: str
    raw: bytes
    nothing: None
    maybe: int | None
    color: Color
    point: Point
    points: tuple[Point, ...]
    ints: tuple[int, ...]
    pair: tuple[str, bytes]
    tags: frozenset[str]
    labels: dict[str, int]
    shapes: dict[str, Circle | Square]
    shape: Circle | Square
    maybe_shape: Circle | Square | None
    maybe_point: Point | None = None
    extra: tuple[Color, ...] = ()
    items: tuple[tuple[bytes, bytes], ...] = ()  # a scan's (key, row) pairs: checked inline, not per call


@dataclass(frozen=True, slots=True)
class Tree:
    value: int
    children: tuple[Tree, ...] = ()


@dataclass(frozen=True, slots=True)
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"n must be positive, got {self.n}")


@dataclass(frozen=True, slots=True)
class KwOnly:
    a: int
    b: str = field(default="x", kw_only=True)


@dataclass(frozen=True, slots=True)
class ConfigV2:
    name: str
    replicas: int = 1  # added in version 2


def make_registry() -> TypeRegistry:
    registry = TypeRegistry("schema-test")
    registry.register(1, Everything)
    registry.register(2, Circle)
    registry.register(3, Square)
    registry.register(4, Tree)
    registry.register(5, Positive)
    registry.register(6, KwOnly)
    registry.register(7, ConfigV2, version=2)
    registry.register(8, Point)
    return registry


REGISTRY = make_registry()
RAFT = raft_registry()


def roundtrip(registry: TypeRegistry, obj: object) -> object:
    data = registry.encode(obj)
    assert isinstance(data, bytes)
    back = registry.decode(data)
    assert type(back) is type(obj)
    assert back == obj
    # to_wire/from_wire, as embedded in frames, agree with encode/decode.
    assert registry.from_wire(unpack_strict(data)) == obj
    return back


@settings(max_examples=300, deadline=None)
@given(st.one_of(*(strategy_for(cls) for cls in RAFT_TYPES)))
def test_raft_messages_round_trip(message: object) -> None:
    roundtrip(RAFT, message)


@settings(max_examples=200, deadline=None)
@given(strategy_for(Everything))
def test_every_field_type_round_trips(value: Everything) -> None:
    back = roundtrip(REGISTRY, value)
    assert isinstance(back, Everything)
    assert type(back.points) is tuple and type(back.tags) is frozenset and type(back.color) is Color


def test_recursive_kw_only_and_defaults_round_trip() -> None:
    tree = Tree(1, (Tree(2), Tree(3, (Tree(4),))))
    roundtrip(REGISTRY, tree)
    roundtrip(REGISTRY, KwOnly(5, b="y"))
    roundtrip(REGISTRY, ConfigV2("t", 3))


def test_fetch_response_with_entries_round_trips() -> None:
    entries = tuple(Entry(i, 2, bytes([i]) * 10, EntryKind.DATA) for i in range(100))
    response = raft.FetchResponse(
        1, 2, 3, 1, raft.ErrorCode.NONE, 0, 0, 100, entries, DivergingEpoch(1, 5), SnapshotId(4, 1)
    )
    roundtrip(RAFT, response)


def test_wire_form_is_type_id_version_fields() -> None:
    vote = raft.Vote(src=1, dst=2, epoch=3, last_epoch=2, last_epoch_end_offset=10)
    assert RAFT.to_wire(vote) == [1, 1, [1, 2, 3, 2, 10]]
    assert unpack_strict(RAFT.encode(vote)) == [1, 1, [1, 2, 3, 2, 10]]


def test_float_field_accepts_int_on_encode_and_sends_a_float() -> None:
    data = REGISTRY.encode(Circle(Point(0, 0), 2))
    assert unpack_strict(data)[2][1] == 2.0 and isinstance(unpack_strict(data)[2][1], float)


def test_frozenset_encoding_is_deterministic() -> None:
    registry = TypeRegistry()

    @dataclass(frozen=True)
    class Tags:
        tags: frozenset[str]

    registry.register(1, Tags)
    words = [f"w{i}" for i in range(50)]
    assert registry.encode(Tags(frozenset(words))) == registry.encode(Tags(frozenset(reversed(words))))


# -- strict decoding -----------------------------------------------------------------------------------


def vote_wire(**changes: Any) -> list[Any]:
    fields = {"src": 1, "dst": 2, "epoch": 3, "last_epoch": 2, "last_epoch_end_offset": 10} | changes
    return [1, 1, list(fields.values())]


def fetch_response_wire() -> list[Any]:
    entries = (Entry(0, 1, b"a"), Entry(1, 1, b"b", EntryKind.LEADER_CHANGE))
    response = raft.FetchResponse(1, 2, 3, None, raft.ErrorCode.NONE, 0, 0, 2, entries)
    wire: list[Any] = unpack_strict(RAFT.encode(response))
    return wire


def with_entry_field(index: int | slice, value: object) -> list[Any]:
    wire = fetch_response_wire()
    wire[2][8][1][index] = value
    return wire


BAD_WIRE: list[tuple[str, object, str]] = [
    ("not a list", "hello", "cannot decode message: expected [type_id, version, fields], got str 'hello'"),
    ("short tag", [1, 1], "expected [type_id, version, fields]"),
    ("type id not int", ["1", 1, []], "type id: expected int, got str '1'"),
    ("unknown type id", [99, 1, []], "unknown type id 99 in raft-test"),
    (
        "newer version",
        [1, 2, [1, 2, 3, 2, 10]],
        "cannot decode Vote: version 2 is newer than the known version 1",
    ),
    ("version zero", [1, 0, [1, 2, 3, 2, 10]], "cannot decode Vote: version 0 is invalid"),
    (
        "bool version",
        [1, True, [1, 2, 3, 2, 10]],
        "cannot decode Vote: expected an int version, got bool True",
    ),
    ("fields not a list", [1, 1, {"src": 1}], "cannot decode Vote: expected a field array for Vote, got map"),
    (
        "missing field",
        [1, 1, [1, 2, 3, 2]],
        "cannot decode Vote: 4 fields but Vote has 5: missing field 'last_epoch_end_offset'",
    ),
    (
        "extra field",
        [1, 1, [1, 2, 3, 2, 10, 11]],
        "cannot decode Vote: 6 fields but Vote has 5 (extra fields)",
    ),
    ("str for int", vote_wire(epoch="3"), "cannot decode Vote.epoch: expected int, got str '3'"),
    ("bool for int", vote_wire(epoch=True), "cannot decode Vote.epoch: expected int, got bool True"),
    ("float for int", vote_wire(epoch=3.0), "cannot decode Vote.epoch: expected int, got float 3.0"),
    ("nil for int", vote_wire(src=None), "cannot decode Vote.src: expected int, got NoneType None"),
    (
        "int for bool",
        [2, 1, [1, 2, 3, 1, None]],
        "cannot decode VoteResponse.granted: expected bool, got int 1",
    ),
    (
        "str for optional int",
        [2, 1, [1, 2, 3, True, "x"]],
        "cannot decode VoteResponse.leader_id: expected int, got str 'x'",
    ),
    (
        "int for bytes",
        with_entry_field(2, 5),
        "cannot decode FetchResponse.entries[1].data: expected bytes, got int 5",
    ),
    (
        "str for bytes",
        with_entry_field(2, "b"),
        "cannot decode FetchResponse.entries[1].data: expected bytes, got str 'b'",
    ),
    (
        "bad enum value",
        with_entry_field(3, 7),
        "cannot decode FetchResponse.entries[1].kind: 7 is not a valid EntryKind",
    ),
    (
        "bool for enum",
        with_entry_field(3, True),
        "cannot decode FetchResponse.entries[1].kind: expected int (EntryKind), got bool True",
    ),
    (
        "short nested",
        with_entry_field(slice(0, 4), [0, 1]),
        "cannot decode FetchResponse.entries[1]: 2 fields but Entry has 4: missing field 'data'",
    ),
]


@pytest.mark.parametrize(
    ("value", "message"), [(v, m) for _, v, m in BAD_WIRE], ids=[n for n, _, _ in BAD_WIRE]
)
def test_decode_refuses_with_a_message_naming_type_and_field(value: object, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        RAFT.from_wire(value)
    assert message in str(info.value)


def test_decode_refuses_bad_containers_and_unions() -> None:
    base = unpack_strict(REGISTRY.encode(sample_everything()))

    def bad(index: int, value: object) -> str:
        wire: list[Any] = [1, 1, list(base[2])]
        wire[2][index] = value
        with pytest.raises(DecodeError) as info:
            REGISTRY.from_wire(wire)
        return str(info.value)

    assert "Everything.nothing: expected nil, got int 0" in bad(5, 0)
    assert "Everything.ints[1]: expected int, got str 'x'" in bad(10, [1, "x"])
    assert "Everything.pair: expected array of 2, got list of length 3" in bad(11, ["a", b"b", 1])
    assert "Everything.tags: duplicate elements in a set" in bad(12, ["a", "a"])
    assert "Everything.items[1][1]: expected bytes, got int 5" in bad(19, [[b"k", b"v"], [b"k", 5]])
    assert "Everything.items[0]: expected array of 2, got list of length 1" in bad(19, [[b"k"]])
    assert "Everything.labels: expected str keys, got bytes of length 1" in bad(13, {b"k": 1})
    assert "Everything.labels['k']: expected int, got float 1.5" in bad(13, {"k": 1.5})
    # A tagged value of a registered type that the union does not allow.
    assert "Everything.shape: expected Circle | Square, got Point" in bad(15, [8, 1, [1, 2]])
    assert "Everything.shape<Circle>.center.x: expected int, got str 'no'" in bad(
        15, [2, 1, [["no", 1], 1.0]]
    )
    assert "Everything.shape: unknown type id 77" in bad(15, [77, 1, []])
    assert "Everything.f: expected float, got int 1" in bad(1, 1)


def sample_everything() -> Everything:
    return Everything(
        i=1,
        f=0.5,
        b=True,
        s="s",
        raw=b"r",
        nothing=None,
        maybe=None,
        color=Color.GREEN,
        point=Point(1, 2),
        points=(Point(3, 4),),
        ints=(1, 2),
        pair=("a", b"b"),
        tags=frozenset({"t"}),
        labels={"k": 1},
        shapes={"c": Circle(Point(0, 0), 1.0)},
        shape=Square(Point(0, 0), 2.0),
        maybe_shape=None,
    )


@dataclass(frozen=True)
class Labelled:
    labels: dict[str, int]


@dataclass(frozen=True)
class Sets:
    items: frozenset[Labelled]


def test_unhashable_set_elements_are_a_decode_error() -> None:
    registry = TypeRegistry()
    registry.register(1, Sets)
    with pytest.raises(DecodeError, match=r"Sets.items: set elements are not hashable"):
        registry.from_wire([1, 1, [[[{"a": 1}]]]])


def test_post_init_refusal_is_a_decode_error() -> None:
    with pytest.raises(
        DecodeError, match=r"Positive: Positive refused the values: ValueError: n must be positive"
    ):
        REGISTRY.from_wire([5, 1, [-1]])


def test_older_version_may_omit_trailing_fields_with_defaults() -> None:
    assert REGISTRY.from_wire([7, 1, ["t"]]) == ConfigV2("t", 1)
    assert REGISTRY.from_wire([7, 2, ["t", 3]]) == ConfigV2("t", 3)
    with pytest.raises(DecodeError, match="missing field 'name'"):
        REGISTRY.from_wire([7, 2, []])
    with pytest.raises(DecodeError, match="version 3 is newer than the known version 2"):
        REGISTRY.from_wire([7, 3, ["t", 3, 4]])


def test_decode_bytes_refuses_bad_msgpack() -> None:
    good = RAFT.encode(raft.Vote(1, 2, 3, 2, 10))
    for data, expected in [
        (b"", "not valid msgpack"),
        (good[:-1], "not valid msgpack"),
        (good + b"\x00", "not valid msgpack: ExtraData"),
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb({1: 2}), "not valid msgpack"),  # int map keys are refused (strict_map_key)
        (msgpack.packb([1, 1, [1, 2, 3, 2, 10]], use_bin_type=True) + b"", ""),
    ]:
        if not expected:
            assert RAFT.decode(data) == raft.Vote(1, 2, 3, 2, 10)
            continue
        with pytest.raises(DecodeError, match=expected):
            RAFT.decode(data)
    with pytest.raises(DecodeError, match="expected bytes"):
        RAFT.decode("text")  # type: ignore[arg-type]


# An arbitrary msgpack-able value, to throw at from_wire.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(msgpack_values, st.tuples(st.integers(0, 9), st.integers(-1, 3), msgpack_values).map(list)))
def test_any_value_decodes_or_raises_decode_error(value: object) -> None:
    for registry in (RAFT, REGISTRY):
        try:
            decoded = registry.from_wire(value)
        except DecodeError:
            continue
        assert type(decoded) in registry.registered().values()


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_mutated_wire_values_decode_or_raise_decode_error(data: st.DataObject) -> None:
    original = data.draw(st.one_of(strategy_for(Everything), strategy_for(raft.FetchResponse)))
    registry = REGISTRY if isinstance(original, Everything) else RAFT
    wire = unpack_strict(registry.encode(original))
    # Replace one node of the wire tree (found by a random walk) with an arbitrary value.
    node: Any = wire
    while True:
        if isinstance(node, list) and node:
            index = data.draw(st.integers(0, len(node) - 1))
        elif isinstance(node, dict) and node:
            index = data.draw(st.sampled_from(sorted(node)))
        else:
            break
        if data.draw(st.booleans()) or not isinstance(node[index], (list, dict)):
            node[index] = data.draw(msgpack_values)
            break
        node = node[index]
    with contextlib.suppress(DecodeError):
        registry.from_wire(wire)


# -- encoding ------------------------------------------------------------------------------------------


def test_encode_refuses_wrong_types_naming_the_field() -> None:
    cases: list[tuple[object, str]] = [
        (raft.Vote(1, 2, "3", 2, 10), "cannot encode Vote.epoch: expected int, got str '3'"),  # type: ignore[arg-type]
        (raft.Vote(1, 2, True, 2, 10), "cannot encode Vote.epoch: expected int, got bool True"),
        (raft.VoteResponse(1, 2, 3, 1, None), "cannot encode VoteResponse.granted: expected bool, got int 1"),  # type: ignore[arg-type]
        (
            raft.FetchResponse(1, 2, 3, None, raft.ErrorCode.NONE, 0, 0, 0, (Entry(0, 1, "x"),)),  # type: ignore[arg-type]
            "cannot encode FetchResponse.entries[0].data: expected bytes, got str 'x'",
        ),
        (
            raft.BeginQuorumEpochResponse(1, 2, 3, 0),  # type: ignore[arg-type]
            "cannot encode BeginQuorumEpochResponse.error: expected ErrorCode, got int 0",
        ),
        (Entry(0, 1, b""), "cannot encode Entry: Entry is not registered in raft-test"),
        ("text", "cannot encode str: str is not registered"),
        (raft.Vote(1, 2, 2**64, 2, 10), "cannot encode Vote: an int does not fit in 64 bits"),
    ]
    for obj, message in cases:
        with pytest.raises(EncodeError) as info:
            RAFT.encode(obj)
        assert message in str(info.value)
    with pytest.raises(EncodeError, match=r"Everything.shape: expected Circle \| Square, got Point"):
        REGISTRY.encode(dataclasses.replace(sample_everything(), shape=Point(1, 1)))  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"Everything.points\[0\]: expected Point, got Circle"):
        REGISTRY.encode(dataclasses.replace(sample_everything(), points=(Circle(Point(0, 0), 1.0),)))  # type: ignore[arg-type]


# -- registration --------------------------------------------------------------------------------------


def test_register_refuses_bad_classes_and_duplicates() -> None:
    registry = TypeRegistry("r")
    registry.register(1, Point)

    @dataclass
    class Mutable:
        x: int

    @dataclass(frozen=True)
    class HasList:
        xs: list[int]

    @dataclass(frozen=True)
    class HasMixedUnion:
        x: int | str

    @dataclass(frozen=True)
    class HasIntKeys:
        x: dict[int, str]

    @dataclass(frozen=True)
    class HasAny:
        x: Any

    class Plain:
        pass

    @dataclass(frozen=True)
    class Unresolvable:
        x: NotDefinedAnywhere  # type: ignore[name-defined]  # noqa: F821

    for type_id, cls, message in [
        (1, Circle, "type id 1 is already registered to Point"),
        (2, Point, "Point is already registered in r as type id 1"),
        (-1, Circle, "type id must be an int"),
        (3, Mutable, "Mutable must be a frozen dataclass"),
        (3, Plain, "Plain is not a dataclass"),
        (3, HasList, "HasList.xs: unsupported field type list[int]"),
        (3, HasMixedUnion, "HasMixedUnion.x: unsupported union"),
        (3, HasIntKeys, "HasIntKeys.x: dict keys must be str"),
        (3, HasAny, "HasAny.x: unsupported field type Any"),
        (3, Unresolvable, "cannot resolve the annotations"),
    ]:
        with pytest.raises(SchemaError, match=re.escape(message)):
            registry.register(type_id, cls)
    with pytest.raises(SchemaError, match="version must be an int >= 1"):
        registry.register(3, Circle, version=0)
    # Failed registrations leave nothing behind.
    assert registry.registered() == {1: Point}
