"""``observed/STATUS.md``: the fleet at a glance, for whoever opens the repository on GitHub.

Rendered with jinja2 from ``facts.build_view`` every cycle, beside the observed documents it summarises
(``fleet.render_cycle``), so it changes exactly when they do: no clock is read (a box's age is measured to the
snapshot's own ``last_change_at``). Every value from the world goes through ``textsafe``: ``md_inline`` outside a
code block (table cells cannot be broken out of: ``|`` is escaped too), ``md_fenced`` for stderr tails.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from reconciler.core.model import AttemptRecord, Desired, OverheadRecord
from reconciler.core.textsafe import md_fenced, md_inline, visible
from reconciler.observed.codec import OBSERVED_DIR
from reconciler.views.facts import LISTED, build_view

STATUS_MD = f"{OBSERVED_DIR}/STATUS.md"


def duration(seconds: float | None) -> str:
    """``3d 4h``, ``2h 05m``, ``7m``: an age for a table cell ("-" when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m"


def utc(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "-"
    try:
        return dt.datetime.fromtimestamp(round(ts), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # past year 9999: no date to show
        return "-"


def metric(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.6g}"


def _shown(value: Any) -> Any:
    """The dashboard's ``finalize``: a string from the world is made visible (``textsafe.visible``, newlines and tabs
    kept) before autoescaping HTML-escapes it, so raw ESC, C1, BEL or bidi characters never reach the page. Markup
    (the page's own SVG and stylesheet) is left as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value, block=True)
    return value


def usd(v: float | None, unit: str = "$") -> str:
    """``$1.2345`` or ``$0.4500/h`` ("-" when there is no figure, e.g. no cap)."""
    return "-" if v is None else f"${v:.4f}{'/h' if unit == '$/h' else ''}"


def params_text(params: Iterable[tuple[str, Any]]) -> str:
    return " ".join(f"{k}={v}" for k, v in params) or "(no parameters)"


@functools.cache
def environment(*, html: bool = False) -> jinja2.Environment:
    """The jinja2 environment over the package's templates, with the views' filters (``md`` escapes a value for
    markdown). ``html``: HTML-escape every value (the dashboard); otherwise values are escaped by ``md``, explicitly.
    One per kind, kept: a cycle renders STATUS.md without compiling its template again."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reconciler.views", "templates"),
        autoescape=html,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_shown if html else None,
    )
    env.filters.update(
        md=lambda v: md_inline(str(v)), fenced=md_fenced, duration=duration, utc=utc, metric=metric,
        params=params_text, usd=usd,
    )
    env.globals["LISTED"] = LISTED
    return env


def read_status_md(checkout: Path) -> dict[str, str]:
    """STATUS.md as it is in the checkout (none: empty), so a commit message compares it like the other files."""
    path = Path(checkout) / STATUS_MD
    return {STATUS_MD: path.read_text(encoding="utf-8")} if path.is_file() else {}


def render_status_md(files: Mapping[str, str | None], history: Iterable[AttemptRecord], desired: Desired | None,
                     overheads: Iterable[OverheadRecord] = ()) -> str:
    """STATUS.md's text from the observed documents (path -> text), the archived attempts, the archive's overhead
    lines (the ops tax) and desired/."""
    view = build_view(files, history, desired, overheads)
    return environment().get_template("STATUS.md.j2").render(v=view)
