"""The SQL dialect of pull queries: sqlglot's default with ksqlDB's lexical rules (fast.py also reads its
keyword lists, to leave statements using a keyword as a name to the full parser)."""

from __future__ import annotations

from typing import ClassVar

from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import Tokenizer as _BaseTokenizer

__all__ = ["PullDialect"]


# sqlglot's default dialect with ksqlDB's lexical rules: backtick identifiers, single-quoted strings only,
# and X'..' hex literals for BYTES keys.
class PullDialect(Dialect):
    class Tokenizer(_BaseTokenizer):
        QUOTES: ClassVar[list[str | tuple[str, str]]] = ["'"]  # so that "x" is an identifier, not a string
        IDENTIFIERS: ClassVar[list[str | tuple[str, str]]] = ["`", '"']
        HEX_STRINGS: ClassVar[list[str | tuple[str, str]]] = [("X'", "'"), ("x'", "'")]
