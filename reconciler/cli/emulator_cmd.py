"""``rigsync emulator``: serve the Vast.ai emulator (API + real SSH boxes) in the foreground.

Demos and manual runs point the real ``vastai`` CLI or ``rigsync`` at it; SIGTERM or Ctrl-C tears every box
down so no sshd is left behind.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from reconciler.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve a Vast.ai-compatible API whose instances are real OpenSSH hosts on loopback "
        "addresses. Prints the base URL and API key; SIGTERM or Ctrl-C tears everything down."
    )
    from reconciler.emulator import core as emulator  # its defaults; imported only for this command

    p.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (default: a free port)")
    p.add_argument("--api-key", default=None, help="API key clients must send (default: a random key)")
    p.add_argument("--state-dir", type=Path, default=None, help="where boxes live (default: a temp dir)")
    p.add_argument("--seed", type=int, default=emulator.DEFAULT_SEED, help="market seed (default %(default)s)")
    p.add_argument(
        "--offers", type=int, default=emulator.DEFAULT_OFFERS,
        help="number of offers in the market (default %(default)s)",
    )
    p.add_argument(
        "--boot-delay", type=float, default=emulator.DEFAULT_BOOT_DELAY_S,
        help="seconds a box spends loading (default %(default)g)",
    )
    p.add_argument(
        "--host-prefix", default=emulator.DEFAULT_HOST_PREFIX, help="loopback /24 for boxes (default %(default)s)"
    )
    p.add_argument(
        "--credit", type=float, default=emulator.DEFAULT_CREDIT_USD,
        help="the account's starting credit in $ (default %(default)g)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.emulator import Emulator

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    if args.offers < 0:
        raise UserError(f"--offers must be >= 0, got {args.offers}")
    if args.boot_delay < 0:
        raise UserError(f"--boot-delay must be >= 0, got {args.boot_delay}")
    if not args.credit >= 0:  # also refuses NaN
        raise UserError(f"--credit must be >= 0, got {args.credit}")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    emu = Emulator(port=args.port, api_key=args.api_key, state_dir=args.state_dir, seed=args.seed,
                   offers=args.offers, boot_delay=args.boot_delay, host_prefix=args.host_prefix,
                   credit=args.credit)
    try:
        try:
            emu.start()
        except OSError as exc:
            raise UserError(f"cannot serve on 127.0.0.1:{args.port}: {exc.strerror or exc}") from exc
        print(f"VAST_URL={emu.url}", flush=True)
        print(f"VAST_API_KEY={emu.api_key}", flush=True)
        # what a shell needs to point rigsync at this emulator (the key only ever goes to the controller's URL)
        print(f"export RIGSYNC_API_URL={emu.url} VAST_API_KEY={emu.api_key}", flush=True)
        print(f"state dir: {emu.state_dir}", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
        print("rigsync emulator: shutting down", file=sys.stderr, flush=True)
    finally:
        emu.close()
        for s, h in old.items():
            signal.signal(s, h)
    return 0
