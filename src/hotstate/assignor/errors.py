"""Errors of the assignor itself (as opposed to bad input, which raises ValueError)."""

from __future__ import annotations


class AssignorInternalError(RuntimeError):
    """An invariant of the assignor broke: a bug, never the caller's fault. Report it with the input."""
