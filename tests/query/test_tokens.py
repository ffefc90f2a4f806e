"""Consistency tokens (query/tokens.py): round trips, merging, and every bad token refused by kind."""

from __future__ import annotations

import base64

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotstate.query.tokens import PREFIX, TokenError, cluster_tag, decode, encode, merge

TAG = cluster_tag("cluster-a")
counts = st.integers(min_value=0, max_value=2**63 - 1)
positions = st.dictionaries(st.tuples(st.integers(0, 1000), st.integers(0, 9999)), counts, max_size=50)


@given(positions)
def test_a_token_round_trips(value: dict[tuple[int, int], int]) -> None:
    token = encode(value, TAG)
    assert token.startswith(PREFIX) and token.isascii()
    assert decode(token, TAG) == value


@given(positions, positions)
def test_merge_keeps_the_larger_position_of_each_partition(
    a: dict[tuple[int, int], int], b: dict[tuple[int, int], int]
) -> None:
    merged = merge(a, b)
    assert merged.keys() == a.keys() | b.keys()
    for key, position in merged.items():
        assert position == max(a.get(key, -1), b.get(key, -1))


def test_a_token_for_6_partitions_is_short() -> None:
    token = encode({(1, p): 1_000_000 + p for p in range(6)}, TAG)
    assert len(token) < 80


def test_a_token_of_another_cluster_is_foreign() -> None:
    token = encode({(1, 0): 5}, cluster_tag("cluster-b"))
    with pytest.raises(TokenError, match="another cluster") as error:
        decode(token, TAG)
    assert error.value.kind == "foreign"


def _raw(value: object) -> str:
    return PREFIX + base64.urlsafe_b64encode(msgpack.packb(value)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "hs2.AAAA",
        PREFIX + "!!!not base64!!!",
        PREFIX + "AAAA",
        _raw([TAG]),
        _raw(["not bytes", []]),
        _raw([TAG, [[1, [0]]]]),  # an odd number of values: not pairs
        _raw([TAG, [[1, [0, -5]]]]),  # a negative position
        _raw([TAG, [[-1, [0, 5]]]]),
        _raw([TAG, [[1, [0, 2**64 - 1]]]]),
        _raw([TAG, [[1, [0, "5"]]]]),
        _raw([TAG, {"a": 1}]),
        PREFIX + "A" * (1 << 20),
    ],
)
def test_malformed_tokens_are_refused_as_malformed(token: str) -> None:
    with pytest.raises(TokenError) as error:
        decode(token, TAG)
    assert error.value.kind == "malformed"
