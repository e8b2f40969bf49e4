"""``rigsync dashboard``: the fleet as one local HTML page, from the committed files alone (no credentials).

``--out FILE`` writes the page (one self-contained file: stylesheet inlined, SVG charts, no network);
``--port P`` serves it on 127.0.0.1 (rebuilt from the files on every request, so a reload shows a new pull);
with neither, the page is written to ``views.dashboard.default_out`` (inside the checkout's .git/).
"""

from __future__ import annotations

import argparse
import http.server
from pathlib import Path

from reconciler.cli._common import add_checkout_arg
from reconciler.errors import UserError
from reconciler.views import dashboard


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Build an HTML page of the fleet (boxes, runs by phase, spend against the caps, learning "
        "curves, cells by metric) from the checkout's committed files. Nothing is contacted."
    )
    add_checkout_arg(p)
    p.add_argument("--out", default=None, metavar="FILE", help="write the page to FILE (one self-contained file)")
    p.add_argument("--port", type=int, default=None, metavar="P", help="serve the page on http://127.0.0.1:P/")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    repo = Path(args.repo)
    if not repo.is_dir():
        raise UserError(f"{repo}: not a directory")
    if not (repo / "desired").is_dir() and not (repo / "observed").is_dir():
        raise UserError(f"{repo}: no desired/ and no observed/ here: not a fleet repository")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: not a TCP port (0-65535)")
    if args.out is not None or args.port is None:
        try:
            written = dashboard.write(repo, Path(args.out) if args.out else None)
        except OSError as exc:
            raise UserError(f"{args.out or dashboard.default_out(repo)}: cannot write the dashboard: {exc}") from exc
        print(dashboard.open_hint(written))
    if args.port is not None:
        serve(repo, args.port)
    return 0


def serve(repo: Path, port: int) -> None:
    """Serve the page of ``repo`` on 127.0.0.1:``port`` until interrupted (loopback only: it shows spend)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            body = dashboard.build(repo).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        raise UserError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from exc
    with server:
        print(f"serving the dashboard of {repo.resolve()} on http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)",
              flush=True)
        server.serve_forever()
