"""The SQL front end's parser: a pipeline script of CREATE SOURCE and CREATE TABLE ... AS SELECT statements.

    CREATE SOURCE clicks (user STRING, url STRING, ts TIMESTAMP)
      WITH (format='json', path='data/clicks/');
    CREATE TABLE clicks_per_user WITH (partitions=8, standby_replicas=1, acceptable_lag=1000) AS
      SELECT user, count(*) AS clicks, max(ts) AS last_seen FROM clicks GROUP BY user;

Pure text work, no Spark: the script is split into statements (quotes and comments respected), each
remembering the line it starts on; the CREATE headers and their WITH options are checked here, and the
key of a table is found from its SELECT's GROUP BY with sqlglot. The SELECT itself is Spark SQL and is
judged by Spark (`hotstate.spark.pipeline`), whose errors come back with the same line numbers. Every
problem is a PipelineError naming the line and the statement.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

__all__ = [
    "FILE_FORMATS",
    "FORMATS",
    "TYPES",
    "Column",
    "Pipeline",
    "PipelineError",
    "Source",
    "Statement",
    "Table",
    "group_by_key",
    "parse_script",
    "parse_statement",
    "split_statements",
]

# SQL type -> the Spark DDL type it becomes.
TYPES = {
    "STRING": "STRING",
    "INT": "INT",
    "INTEGER": "INT",
    "BIGINT": "BIGINT",
    "DOUBLE": "DOUBLE",
    "FLOAT": "FLOAT",
    "BOOLEAN": "BOOLEAN",
    "TIMESTAMP": "TIMESTAMP",
    "DATE": "DATE",
}
FILE_FORMATS = ("json", "csv", "parquet")
FORMATS = (*FILE_FORMATS, "rate")
RATE_OPTIONS = ("rowsPerSecond", "rampUpTime", "numPartitions")
RATE_SCHEMA = "timestamp TIMESTAMP, value BIGINT"
TABLE_OPTIONS = ("partitions", "standby_replicas", "acceptable_lag", "key", "checkpoint", "trigger")
# What hotstate accepts as a table name (the controller's rule).
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERVAL = re.compile(
    r"(?i)\s*(interval\s+)?\d+(\.\d+)?\s*"
    r"(ms|milliseconds?|s|secs?|seconds?|mins?|minutes?|h|hours?|days?)\s*"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?([eE][+-]?\d+)?")

OptionValue = str | int | float | bool


class PipelineError(Exception):
    """A statement that cannot run: `line` is where the statement starts in the script (1-based)."""

    def __init__(self, statement: str, line: int, message: str) -> None:
        super().__init__(statement, line, message)
        self.statement = statement
        self.line = line
        self.message = message

    @property
    def head(self) -> str:
        """The statement's first words, e.g. "CREATE TABLE clicks_per_user ..."."""
        flat = " ".join(self.statement.split())
        words = flat.split("(", 1)[0].split()
        head = " ".join(words[:3])
        return head + (" ..." if head != flat else "") if head else ""

    def __str__(self) -> str:
        head = self.head
        return f"line {self.line}: {head}: {self.message}" if head else f"line {self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class Statement:
    text: str  # from its first token up to (not including) the `;`
    line: int  # the line of its first token, 1-based
    column: int = 0  # where its first token is in that line, 0-based

    def error(self, message: str) -> PipelineError:
        return PipelineError(self.text, self.line, message)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # the Spark DDL type, e.g. BIGINT

    def ddl(self) -> str:
        return f"`{self.name.replace('`', '``')}` {self.type}"


@dataclass(frozen=True, slots=True)
class Source:
    """CREATE SOURCE: a streaming input registered as a temp view named `name`."""

    name: str
    format: str  # one of FORMATS
    path: str | None  # None for rate
    columns: tuple[Column, ...]  # empty for rate
    options: dict[str, str]  # passed to the reader as they are (format and path taken out)
    statement: Statement

    def schema(self) -> str:
        """The Spark DDL schema of the source's rows."""
        return RATE_SCHEMA if self.format == "rate" else ", ".join(c.ddl() for c in self.columns)


@dataclass(frozen=True, slots=True)
class Table:
    """CREATE TABLE ... AS SELECT: the SELECT's result, materialized by `key` in a hotstate table."""

    name: str
    select: str
    select_line: int  # the line the SELECT starts on
    select_column: int  # where in that line, 0-based
    partitions: int
    standby_replicas: int
    acceptable_lag: int | None
    key: tuple[str, ...] | None  # key= of WITH, else the GROUP BY columns; None: see key_problem
    key_problem: str | None  # why the key is not known (no GROUP BY and no key=, ...)
    checkpoint: str | None
    trigger: str | None  # a processing-time interval such as "5 seconds", or "availableNow"
    statement: Statement

    def require_key(self) -> tuple[str, ...]:
        if self.key is None:
            raise self.statement.error(self.key_problem or "the key is not known: name it with key='...'")
        return self.key


@dataclass(frozen=True, slots=True)
class Pipeline:
    sources: tuple[Source, ...] = ()
    tables: tuple[Table, ...] = field(default=())


# ---------------------------------------------------------------------------------------------- splitting


def split_statements(script: str) -> list[Statement]:
    """The statements of `script`, separated by `;` outside quotes and comments, each with its first
    line. `--` comments, `/* */` comments, 'strings', "strings" and `identifiers` are respected; empty
    statements (only whitespace and comments) are dropped."""
    statements: list[Statement] = []
    i, n, line = 0, len(script), 1
    start: int | None = None
    start_line = 1
    while i < n:
        i, line = _skip_blank(script, i, line)
        if i < 0:
            raise PipelineError(
                _tail(script, start),
                start_line if start is not None else line,
                f"unterminated /* comment starting on line {line}",
            )
        if i == n:
            break
        c = script[i]
        if c == ";":
            if start is not None:
                statements.append(_statement(script, start, i, start_line))
                start = None
            i += 1
        else:
            if start is None:
                start, start_line = i, line
            if c in "'\"`":
                end = _quote_end(script, i)
                if end < 0:
                    what = "identifier" if c == "`" else "string"
                    raise PipelineError(
                        _tail(script, start), start_line, f"unterminated {what} starting on line {line}"
                    )
                line += script.count("\n", i, end)
                i = end
            else:
                i += 1
    if start is not None:
        statements.append(_statement(script, start, n, start_line))
    return statements


def _skip_blank(text: str, i: int, line: int) -> tuple[int, int]:
    """Past the whitespace and comments at `i`: the index and line of the next other character (or of the
    end). Splitting and tokenizing share it so they agree on what a comment is. An unterminated /* comment
    gives index -1 and the line it starts on."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                return -1, line
            line += text.count("\n", i, end)
            i = end + 2
        else:
            break
    return i, line


def _statement(script: str, start: int, end: int, line: int) -> Statement:
    return Statement(script[start:end].rstrip(), line, start - (script.rfind("\n", 0, start) + 1))


def _tail(script: str, start: int | None) -> str:
    return "" if start is None else script[start:]


def _quote_end(text: str, i: int) -> int:
    """The index just past the quote that closes the one at `i`, or -1. In strings a backslash escapes
    the next character (Spark SQL); in `identifiers` a doubled backtick stands for one."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\" and quote != "`":
            j += 2
        elif c == quote:
            if quote == "`" and text.startswith("``", j):
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return -1


# ---------------------------------------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # word, ident (backquoted), string, number, punct, end
    text: str  # the value: a word as written, an identifier or string unquoted, a number or sign
    start: int  # offset in the statement
    line: int


def _tokens(statement: Statement) -> list[_Token]:
    text, line, i = statement.text, statement.line, 0
    out: list[_Token] = []
    while True:
        # A statement comes from split_statements, which refused an unterminated comment.
        i, line = _skip_blank(text, i, line)
        if not 0 <= i < len(text):
            break
        c = text[i]
        if c in "'\"`":
            end = _quote_end(text, i)
            raw = text[i + 1 : end - 1]
            value = raw.replace("``", "`") if c == "`" else _unescape(raw)
            out.append(_Token("ident" if c == "`" else "string", value, i, line))
            line += text.count("\n", i, end)
            i = end
        elif c.isalpha() or c == "_":
            m = _WORD.match(text, i)
            assert m is not None
            out.append(_Token("word", m.group(), i, line))
            i = m.end()
        elif c.isdigit() or (c in "+-" and i + 1 < len(text) and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m is not None
            out.append(_Token("number", m.group(), i, line))
            i = m.end()
        else:
            out.append(_Token("punct", c, i, line))
            i += 1
    out.append(_Token("end", "", len(text), line))
    return out


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


def _unescape(raw: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), raw, flags=re.DOTALL)


class _Cursor:
    def __init__(self, statement: Statement) -> None:
        self.statement = statement
        self.tokens = _tokens(statement)
        self.i = 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def error(self, message: str) -> PipelineError:
        return self.statement.error(message)

    def is_word(self, word: str) -> bool:
        return self.peek.kind == "word" and self.peek.text.upper() == word

    def expect_word(self, word: str, context: str) -> None:
        if not self.is_word(word):
            raise self.error(f"expected {word} {context}, found {_shown(self.peek)}")
        self.take()

    def expect_punct(self, punct: str, context: str) -> None:
        if self.peek.kind != "punct" or self.peek.text != punct:
            raise self.error(f"expected '{punct}' {context}, found {_shown(self.peek)}")
        self.take()

    def is_punct(self, punct: str) -> bool:
        return self.peek.kind == "punct" and self.peek.text == punct

    def name(self, what: str) -> str:
        token = self.peek
        if token.kind not in ("word", "ident") or not token.text:
            raise self.error(f"expected {what}, found {_shown(token)}")
        self.take()
        return token.text


def _shown(token: _Token) -> str:
    if token.kind == "end":
        return "the end of the statement"
    if token.kind == "string":
        return f"the string '{token.text}'"
    if token.kind == "ident":
        return f"`{token.text}`"
    return f"'{token.text}'"


# ---------------------------------------------------------------------------------------------- statements

_USAGE = (
    "expected CREATE SOURCE name (column TYPE, ...) WITH (format='...', ...) "
    "or CREATE TABLE name WITH (partitions=N, ...) AS SELECT ..."
)


def parse_script(script: str) -> Pipeline:
    """Every statement of `script`, checked; raises PipelineError at the first bad one."""
    statements = split_statements(script)
    if not statements:
        raise PipelineError("", 1, "the script has no statements: " + _USAGE)
    sources: list[Source] = []
    tables: list[Table] = []
    for statement in statements:
        parsed = parse_statement(statement)
        if isinstance(parsed, Source):
            if any(s.name.lower() == parsed.name.lower() for s in sources):
                raise statement.error(f"source {parsed.name!r} is defined twice")
            sources.append(parsed)
        else:
            if any(t.name == parsed.name for t in tables):
                raise statement.error(f"table {parsed.name!r} is defined twice")
            tables.append(parsed)
    if not tables:
        last = statements[-1]
        raise PipelineError(
            "", last.line, "the script has no CREATE TABLE ... AS SELECT: nothing to materialize"
        )
    return Pipeline(tuple(sources), tuple(tables))


def parse_statement(statement: Statement) -> Source | Table:
    cursor = _Cursor(statement)
    if not cursor.is_word("CREATE"):
        raise cursor.error(_USAGE)
    cursor.take()
    if cursor.is_word("SOURCE"):
        cursor.take()
        return _source(cursor)
    if cursor.is_word("TABLE"):
        cursor.take()
        return _table(cursor)
    raise cursor.error(_USAGE)


def _source(cursor: _Cursor) -> Source:
    name = cursor.name("the source's name after CREATE SOURCE")
    if not SOURCE_NAME.fullmatch(name):
        raise cursor.error(f"source name {name!r}: must match {SOURCE_NAME.pattern}")
    columns: list[Column] = []
    if cursor.is_punct("("):
        cursor.take()
        while True:
            column = cursor.name("a column name")
            if any(c.name.lower() == column.lower() for c in columns):
                raise cursor.error(f"column {column!r} is named twice")
            if cursor.peek.kind != "word":
                raise cursor.error(f"expected the type of column {column!r}, found {_shown(cursor.peek)}")
            written = cursor.take().text
            spark_type = TYPES.get(written.upper())
            if spark_type is None:
                raise cursor.error(f"column {column!r}: unknown type {written!r} (known: {', '.join(TYPES)})")
            columns.append(Column(column, spark_type))
            if cursor.is_punct(","):
                cursor.take()
                continue
            cursor.expect_punct(")", "after the columns")
            break
    cursor.expect_word("WITH", f"(format='...', ...) after CREATE SOURCE {name}")
    options = _options(cursor)
    if cursor.peek.kind != "end":
        raise cursor.error(f"unexpected {_shown(cursor.peek)} after the WITH options")

    by_lower = {key.lower(): key for key in options}
    if "format" not in by_lower:
        raise cursor.error(f"WITH needs format='...' (one of {', '.join(FORMATS)})")
    fmt = str(options.pop(by_lower["format"])).lower()
    if fmt not in FORMATS:
        raise cursor.error(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    path_value = options.pop(by_lower["path"]) if "path" in by_lower else None
    if fmt == "rate":
        if path_value is not None:
            raise cursor.error("the rate source reads no files: drop path=")
        if columns:
            raise cursor.error(f"the rate source has a fixed schema ({RATE_SCHEMA}): drop the column list")
        for option in options:
            _check_known(cursor, option, RATE_OPTIONS, "option of the rate source")
        path = None
    else:
        if path_value is None or not isinstance(path_value, str) or not path_value.strip():
            raise cursor.error(f"format {fmt!r} needs path='...' (the folder the source watches)")
        if not columns:
            raise cursor.error(
                f"a {fmt} source needs its columns: CREATE SOURCE {name} (column TYPE, ...) WITH (...)"
            )
        path = path_value
        for key, value in options.items():
            if key.lower() == "maxfilespertrigger" and not (isinstance(value, int) and value >= 1):
                raise cursor.error(f"{key} must be a whole number of at least 1, not {_value(value)}")
    return Source(
        name,
        fmt,
        path,
        tuple(columns),
        {key: _option_string(value) for key, value in options.items()},
        cursor.statement,
    )


def _table(cursor: _Cursor) -> Table:
    name = cursor.name("the table's name after CREATE TABLE")
    if not TABLE_NAME.fullmatch(name):
        raise cursor.error(f"table name {name!r}: must match {TABLE_NAME.pattern}")
    if cursor.is_word("AS"):
        raise cursor.error("CREATE TABLE needs WITH (partitions=N, ...) before AS")
    cursor.expect_word("WITH", f"(partitions=N, ...) after CREATE TABLE {name}")
    options = {key.lower(): value for key, value in _options(cursor).items()}
    cursor.expect_word("AS", "SELECT ... after the WITH options")
    start = cursor.peek
    if start.kind == "end":
        raise cursor.error("AS needs a SELECT")
    text = cursor.statement.text
    select = text[start.start :]
    before = text.rfind("\n", 0, start.start)
    select_column = cursor.statement.column + start.start if before < 0 else start.start - before - 1

    for option in options:
        _check_known(cursor, option, TABLE_OPTIONS, "option")
    if "partitions" not in options:
        raise cursor.error("WITH needs partitions=N (how many partitions the table has)")
    partitions = _whole(cursor, options, "partitions", 1)
    standby = _whole(cursor, options, "standby_replicas", 0) if "standby_replicas" in options else 1
    lag = _whole(cursor, options, "acceptable_lag", 0) if "acceptable_lag" in options else None
    checkpoint = _text(cursor, options, "checkpoint") if "checkpoint" in options else None
    trigger = None
    if "trigger" in options:
        trigger = _text(cursor, options, "trigger").strip()
        if trigger.lower() == "availablenow":
            trigger = "availableNow"
        elif not _INTERVAL.fullmatch(trigger):
            raise cursor.error(
                f"trigger {trigger!r}: give a processing-time interval such as '5 seconds' or "
                "'500 milliseconds', or 'availableNow'"
            )
    key: tuple[str, ...] | None
    problem: str | None = None
    if "key" in options:
        names = [part.strip() for part in _text(cursor, options, "key").split(",")]
        if not all(names):
            raise cursor.error(f"key {options['key']!r}: name the key columns, separated by commas")
        if len({n.lower() for n in names}) != len(names):
            raise cursor.error(f"key {options['key']!r} names a column twice")
        key = tuple(names)
    else:
        key, problem = group_by_key(select)
    return Table(
        name,
        select,
        start.line,
        select_column,
        partitions,
        standby,
        lag,
        key,
        problem,
        checkpoint,
        trigger,
        cursor.statement,
    )


def _options(cursor: _Cursor) -> dict[str, OptionValue]:
    cursor.expect_punct("(", "after WITH")
    options: dict[str, OptionValue] = {}
    if cursor.is_punct(")"):
        cursor.take()
        return options
    while True:
        key = cursor.name("an option name")
        while cursor.is_punct("."):  # dotted names, e.g. spark.sql.x
            cursor.take()
            key += "." + cursor.name("the rest of a dotted option name")
        if any(k.lower() == key.lower() for k in options):
            raise cursor.error(f"option {key!r} is given twice")
        cursor.expect_punct("=", f"after option {key!r}")
        options[key] = _literal(cursor, key)
        if cursor.is_punct(","):
            cursor.take()
            continue
        cursor.expect_punct(")", "after the WITH options")
        return options


def _literal(cursor: _Cursor, key: str) -> OptionValue:
    token = cursor.peek
    if token.kind == "string":
        cursor.take()
        return token.text
    if token.kind == "number":
        cursor.take()
        try:
            return int(token.text)
        except ValueError:
            return float(token.text)
    if token.kind == "word" and token.text.upper() in ("TRUE", "FALSE"):
        cursor.take()
        return token.text.upper() == "TRUE"
    raise cursor.error(f"option {key!r}: expected a 'string', a number, TRUE or FALSE, found {_shown(token)}")


def _check_known(cursor: _Cursor, key: str, known: tuple[str, ...], what: str) -> None:
    exact = {k.lower(): k for k in known}
    if key.lower() in exact:
        return
    close = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1)
    hint = f"; did you mean {exact[close[0]]!r}?" if close else ""
    raise cursor.error(f"unknown {what} {key!r} (known: {', '.join(known)}){hint}")


def _whole(cursor: _Cursor, options: dict[str, OptionValue], key: str, least: int) -> int:
    value = options[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise cursor.error(f"{key} must be a whole number of at least {least}, not {_value(value)}")
    return value


def _text(cursor: _Cursor, options: dict[str, OptionValue], key: str) -> str:
    value = options[key]
    if not isinstance(value, str) or not value.strip():
        raise cursor.error(f"{key} must be a non-empty 'string', not {_value(value)}")
    return value


def _value(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return f"'{value}'" if isinstance(value, str) else str(value)


def _option_string(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------------------------------------- the key


def group_by_key(select: str) -> tuple[tuple[str, ...] | None, str | None]:
    """The output columns the SELECT groups by (its key), or None and why not.

    Each GROUP BY item must be a column of the SELECT's output: a column selected as it is or under an
    alias (`GROUP BY user` with `SELECT user` or `SELECT user AS u`), an alias (`GROUP BY site` with
    `lower(url) AS site`), an expression selected under an alias (`GROUP BY lower(url)`), or a position
    (`GROUP BY 1`)."""
    name_key = "name the key with key='column, ...' in WITH"
    try:
        trees = sqlglot.parse(select, read="spark")
    except sqlglot.errors.SqlglotError as error:
        first = _ANSI.sub("", str(error)).splitlines()[0] if str(error) else type(error).__name__
        first = re.sub(r"\.? Line \d+, Col: \d+\.?$", "", first)
        return (
            None,
            f"cannot find the GROUP BY columns of this SELECT (sqlglot cannot parse it: {first}); {name_key}",
        )
    trees = [tree for tree in trees if tree is not None]
    if len(trees) != 1:
        return None, "AS takes exactly one SELECT"
    tree = trees[0]
    group = tree.args.get("group") if isinstance(tree, exp.Select) else None
    if not isinstance(tree, exp.Select) or group is None:
        return None, f"the SELECT has no GROUP BY, so the table's key is not known: {name_key}"
    if group.args.get("all"):
        return None, f"GROUP BY ALL: {name_key}"
    for kind in ("rollup", "cube", "grouping_sets"):
        if group.args.get(kind):
            return None, f"GROUP BY with {kind.upper().replace('_', ' ')} gives null keys: {name_key}"
    projections = list(tree.expressions)
    key: list[str] = []
    for item in group.expressions:
        if any(isinstance(e, (exp.Rollup, exp.Cube, exp.GroupingSets)) for e in item.walk()):
            return None, f"GROUP BY with ROLLUP, CUBE or GROUPING SETS gives null keys: {name_key}"
        found = _output_column(item, projections)
        if isinstance(found, _Problem):
            return None, f"{found.text}; {name_key}"
        if found.lower() not in (k.lower() for k in key):
            key.append(found)
    return tuple(key), None


@dataclass(frozen=True, slots=True)
class _Problem:
    text: str


def _output_column(item: exp.Expression, projections: list[exp.Expression]) -> str | _Problem:
    e = exp
    shown = item.sql(dialect="spark")
    if isinstance(item, e.Literal) and not item.is_string:
        try:
            position = int(item.this)
        except ValueError:
            return _Problem(f"GROUP BY {shown} is not a column position")
        if not 1 <= position <= len(projections):
            return _Problem(f"GROUP BY {shown}: the SELECT has {len(projections)} columns")
        chosen = projections[position - 1]
        if isinstance(chosen, e.Star) or not chosen.output_name:
            return _Problem(f"GROUP BY {shown}: select that column with an alias")
        return chosen.output_name
    bare = [p.this if isinstance(p, e.Alias) else p for p in projections]
    if isinstance(item, e.Column):
        for projection, inner in zip(projections, bare, strict=True):
            if (
                isinstance(inner, e.Column)
                and inner.name.lower() == item.name.lower()
                and (not item.table or not inner.table or item.table.lower() == inner.table.lower())
            ):
                return projection.output_name
        if not item.table:
            for projection in projections:
                if isinstance(projection, e.Alias) and projection.alias.lower() == item.name.lower():
                    return projection.alias
    else:
        wanted = item.sql(dialect="spark", normalize=True)
        for projection, inner in zip(projections, bare, strict=True):
            if isinstance(inner, e.Expression) and inner.sql(dialect="spark", normalize=True) == wanted:
                if not isinstance(projection, e.Alias):
                    return _Problem(f"GROUP BY {shown}: select it with an alias (... AS name)")
                return projection.alias
    return _Problem(f"GROUP BY {shown} is not a column of the SELECT's output: select it (with an alias)")
