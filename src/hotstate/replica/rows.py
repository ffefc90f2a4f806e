"""Moved to `hotstate.protocol.rows`. Kept only for server/queries.py and tests/server/test_queries.py and
test_query_rounds.py, which another change is splitting at the same time: import from
`hotstate.protocol.rows` and delete this module once those are merged."""

from hotstate.protocol.rows import *  # noqa: F403
from hotstate.protocol.rows import __all__ as __all__
