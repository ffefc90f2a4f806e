"""Moved to `hotstate.protocol.keys`. Kept only for server/queries.py and tests/server/test_queries.py and
test_query_rounds.py, which another change is splitting at the same time: import from
`hotstate.protocol.keys` and delete this module once those are merged."""

from hotstate.protocol.keys import *  # noqa: F403
from hotstate.protocol.keys import __all__ as __all__
