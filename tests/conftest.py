"""Test-suite wide settings."""

from __future__ import annotations

import os

from hypothesis import settings

# CI runs each property test on the same examples every time (a failure there must reproduce, and a
# rare counterexample found by chance must not fail an unrelated change); HYPOTHESIS_PROFILE=explore
# searches fresh examples, as the sim soaks search fresh seeds.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
