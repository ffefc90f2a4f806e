"""Regenerate the tables of keys in docs/configuration.md from SETTINGS (src/hotstate/server/settings.py).

`python scripts/update_config_docs.py` rewrites the file; with `--check` it only exits 1 if it is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hotstate.server.config import DEFAULTS
from hotstate.server.settings import update_doc

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main(args: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    fresh = update_doc(text, DEFAULTS)
    if fresh == text:
        return 0
    if "--check" in args:
        print(f"{DOC} is stale: run python scripts/update_config_docs.py", file=sys.stderr)
        return 1
    DOC.write_text(fresh, encoding="utf-8")
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
