"""``LoadError``: the one shape every problem in the desired tree takes, wherever it is found.

Every module of this package (the tree reader, the YAML reader, the schema, the checks) returns these, so a
user sees every problem at once, each with file, line, column and JSON pointer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_MESSAGE = 300

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class LoadError:
    """One problem in the desired tree. ``file`` is repo-relative; ``line``/``column`` are 1-based or None."""

    file: str
    line: int | None
    column: int | None
    pointer: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.pointer or '/'}: {self.message}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "pointer": self.pointer,
            "message": self.message,
        }

    def sort_key(self) -> tuple[str, int, int, str, str]:
        return (self.file, self.line or 0, self.column or 0, self.pointer, self.message)


def pointer_of(path: Sequence[str | int]) -> str:
    """RFC 6901 JSON pointer of a path inside a document ("" is the whole document)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
