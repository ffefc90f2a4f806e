"""A Spark read of a table is planned against one generation of it (GET /v1/tables `generation`) and reads
it page by page, each page a query of its own: a page of another generation (an overwrite swapped the
table in the middle of the read) fails the read instead of mixing rows of both into one DataFrame."""

from __future__ import annotations

import pytest

from hotstate.controller.records import KeyType
from hotstate.query.tokens import cluster_tag, encode
from hotstate.spark.reading import HotstateReadError, TableShape, same_generation

TAG = cluster_tag("any")


def shape(generation: int | None) -> TableShape:
    return TableShape("t", 2, (("k", KeyType.STRING),), (), generation)


def test_pages_of_the_planned_generation_pass() -> None:
    same_generation(shape(3), encode({(3, 0): 10}, TAG))
    same_generation(shape(3), encode({(3, 0): 10, (3, 1): 4}, TAG))
    same_generation(shape(3), "")  # an answer without a token: nothing to compare
    same_generation(shape(None), encode({(9, 0): 1}, TAG))  # a server that does not say its generation


def test_a_page_of_another_generation_fails_the_read_naming_both() -> None:
    with pytest.raises(
        HotstateReadError, match=r"'t' was overwritten while it was read \(generation 3, now 4\)"
    ):
        same_generation(shape(3), encode({(4, 1): 7}, TAG))
