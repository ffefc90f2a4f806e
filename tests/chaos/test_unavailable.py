"""Where namespaces cannot be made, the chaos tests skip and `python -m hotstate.chaos` refuses, saying
why."""

from __future__ import annotations

import os

import pytest

from hotstate.chaos import netns, run


def test_not_root_is_named_as_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the module netns calls it on
    reason = netns.unavailable_reason()
    assert reason is not None and "need root (CAP_NET_ADMIN)" in reason


def test_a_missing_tool_is_named_with_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    reason = netns.unavailable_reason()
    assert reason is not None and "`ip` is not installed (Debian package iproute2" in reason


def test_the_command_refuses_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(run, "unavailable_reason", lambda: "network namespaces need root")
    assert run.main(["--schedules", "1"]) == 2
    assert "cannot run the chaos schedules: network namespaces need root" in capsys.readouterr().err
