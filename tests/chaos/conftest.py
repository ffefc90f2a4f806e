"""The chaos tests that build network namespaces skip, saying why, where namespaces cannot be made."""

from __future__ import annotations

import pytest

from hotstate.chaos.netns import unavailable_reason


@pytest.fixture(scope="session")
def netns_available() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
