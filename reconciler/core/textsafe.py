"""Text a person will read: control and bidi characters made visible, and markdown that cannot be broken out of.

Whatever rigsync prints or writes for a reviewer — the text of `rigsync plan`/`status`/`diff`/`runs`/`apply`/`run`,
its error lines, the pull-request comment the plan workflow posts, the commit messages of `rigsync run` — carries
values nobody at rigsync chose: sweep and parameter names from desired/ (the loader refuses control characters
there, but a PR is what is being reviewed), instance labels, host names and error messages from the provider's API,
a box's stderr, the holder named in a lease. Printed raw, such a value can drive the reviewer's terminal (ESC
sequences: colours, cursor moves, a rewritten line, OSC 8 links; the C1 CSI ``\\x9b`` does the same on some
terminals) or reorder what is shown (bidi controls, "Trojan Source": U+202E turns ``1.0 > rm`` around). So every
such character is shown as an escape instead, by the one function here, ``visible``, applied at the output
boundary (``cli.main`` wraps stdout and stderr in ``SafeStream``; ``GitRepo.commit_observed`` escapes its message).

The escapes: C0 controls as ``\\x1b`` (tab and newline kept where the text is a block), DEL, C1 controls and the
format characters below as ``\\u202e``. The ``\\u`` form is also a valid JSON string escape of the same character,
so escaping JSON output (where such a character can only stand inside a string) leaves the JSON meaning the same.

Markdown (the PR comment) needs one more rule: text put in a fenced code block is fenced with more backticks than
its longest run of backticks (CommonMark: a fence closes only on a run at least as long as the opening one), so
a value holding ````` cannot close the block and smuggle markdown or HTML into the comment (``md_fenced``); a
value put outside a fence has every ASCII punctuation character backslash-escaped (``md_inline``).

Nothing here imports the rest of rigsync: every layer may use it.
"""

from __future__ import annotations

import re
from typing import IO, Any

# U+061C arabic letter mark, U+200E/F LRM/RLM, U+202A-E embeddings and overrides, U+2066-9 isolates;
# U+2028/9 line and paragraph separators (a line break to some renderers, not to others).
_FORMAT = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
_HAZARD = "[\x00-\x1f\x7f-\x9f" + _FORMAT + "]"
_HAZARD_RE = re.compile(_HAZARD)
_HAZARD_BLOCK_RE = re.compile(_HAZARD.replace("\x00-\x1f", "\x00-\x08\x0b-\x1f"))  # keeps \t and \n
_MD_PUNCT_RE = re.compile(r"([!-/:-@\[-`{-~])")
_BACKTICKS_RE = re.compile(r"`+")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x20 else f"\\u{c:04x}"


def visible(text: str, *, block: bool = False) -> str:
    """``text`` with every control, DEL, C1 and bidi/format character written as an escape (``\\x1b``, ``\\u202e``).

    ``block=True`` keeps newlines and tabs (a multi-line text); otherwise they are escaped too (one value, one line).
    """
    return (_HAZARD_BLOCK_RE if block else _HAZARD_RE).sub(_escape, text)


def has_hazard(text: str) -> bool:
    """Whether ``visible(text, block=True)`` would change anything."""
    return _HAZARD_BLOCK_RE.search(text) is not None


def md_inline(value: str) -> str:
    """One value for markdown outside a code block: made visible, every ASCII punctuation backslash-escaped."""
    return _MD_PUNCT_RE.sub(r"\\\1", visible(value))


def md_fenced(text: str, info: str = "") -> str:
    """``text`` as a fenced code block whose fence is longer than any backtick run in it (at least three)."""
    body = visible(text, block=True).rstrip("\n")
    longest = max((len(m.group(0)) for m in _BACKTICKS_RE.finditer(body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{md_inline(info) if info else ''}\n{body}\n{fence}\n"


def md_section(title: str, text: str) -> str:
    """A markdown section for a comment: a level-3 heading and ``text`` in a safe fence (``md_fenced``).

    ``title`` is rigsync's own words (kept as markdown); a value in it would have to go through ``md_inline``.
    """
    return f"### {visible(title)}\n{md_fenced(text)}"


class SafeStream:
    """A text stream that writes everything through ``visible(..., block=True)``: the CLI's stdout and stderr."""

    def __init__(self, inner: IO[str]) -> None:
        self.inner = inner

    def write(self, s: str) -> int:
        self.inner.write(visible(s, block=True))
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer ...: the wrapped stream's
        if name == "inner" or name.startswith("__"):  # not set yet (copy, pickle): no recursion through inner
            raise AttributeError(name)
        return getattr(self.inner, name)
