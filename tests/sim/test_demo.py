from __future__ import annotations

import pytest

from hotstate.sim import demo


def test_demo_elects_fails_over_and_converges(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "crashed (leader, epoch 1)" in out
    assert "leads epoch 2" in out
    assert "all three state machines identical: yes" in " ".join(out.split())
