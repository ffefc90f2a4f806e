"""ConfigError, the error every check of a configuration raises, and how it words what it reports."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Final


class _Missing:
    def __repr__(self) -> str:
        return "<not set>"


MISSING: Final = _Missing()


class _Redacted:
    """Stands in for the secret in errors, which end up in logs."""

    def __init__(self, value: object) -> None:
        self.description = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__

    def __repr__(self) -> str:
        return f"<redacted: {self.description}>"


class ConfigError(Exception):
    """A bad configuration value: `key`, the `value` given and `allowed`, what the key accepts.

    `str(error)` reads `node.id='abc': must be a positive integer`, followed by ` (from env HOTSTATE_NODE_ID)`
    when the source is known. When several values are bad, the first error is raised and `errors` holds
    all of them; `str()` then gives one line each.
    """

    key: str
    value: object
    allowed: str
    source: str | None
    errors: tuple[ConfigError, ...]

    def __init__(
        self,
        key: str,
        value: object,
        allowed: str,
        *,
        source: str | None = None,
        others: Sequence[ConfigError] = (),
    ) -> None:
        if key == "cluster.secret" and not isinstance(value, _Missing | _Redacted):
            value = _Redacted(value)
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        self.errors = (self, *others)
        super().__init__(str(self))

    def line(self) -> str:
        head = f"{self.key} is not set" if isinstance(self.value, _Missing) else f"{self.key}={self.value!r}"
        tail = f" (from {self.source})" if self.source else ""
        return f"{head}: {self.allowed}{tail}"

    def __str__(self) -> str:
        return "\n".join(error.line() for error in self.errors)

    @staticmethod
    def combine(errors: Sequence[ConfigError]) -> ConfigError:
        # A raised error carries the others in `errors`; a list may hold it and its others too.
        singles = list({id(single): single for error in errors for single in error.errors}.values())
        first = singles[0]
        return ConfigError(first.key, first.value, first.allowed, source=first.source, others=singles[1:])

    def with_sources(self, sources: Mapping[str, str]) -> ConfigError:
        return ConfigError.combine(
            [
                ConfigError(e.key, e.value, e.allowed, source=e.source or sources.get(e.key))
                for e in self.errors
            ]
        )


def nearest(key: str, candidates: Sequence[str]) -> str | None:
    matches = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None
