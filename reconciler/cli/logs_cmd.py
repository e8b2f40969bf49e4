"""``rigsync logs RUN[.ATTEMPT]``: an attempt's stdout (or ``--stderr``), from the local store or from its box.

Where the bytes come from, in order:

1. the result store, once the harvest brought the attempt there (``ports.ResultStore``: the run directory's
   ``stdout.log``/``stderr.log`` under ``--data-dir``, or in the object store ``--store`` names); no box is
   contacted;
2. the box the attempt ran on (``observed.attempts``: the observed files and the run archive say which), looked
   up in the provider's instance list for its address, read over SSH with rigsync's key and pinned host keys
   (``remote.logs``: bounded slices from a byte offset, so a large log comes home in pieces);
3. otherwise a one-line error: the box was destroyed and the logs were not harvested.

``--follow`` polls the box for new bytes until the attempt's ``exit_code`` appears (or its wrapper is gone
without one), then says so on stderr; stdout carries the log alone. A dropped connection is tried again a couple of
times before the box counts as unreachable. ``--tail N`` starts with the last N lines, and with at most the log's
last ``remote.logs.TAIL_WINDOW_BYTES`` (1 MiB): when N lines are longer than that, their end is shown and stderr says
so.
The log passes through the CLI's ``SafeStream`` like everything rigsync prints: control and bidi characters
(a colour code, a carriage return of a progress bar) are shown as escapes; ``--raw`` writes the bytes as they are.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

from reconciler.adapters.s3store import open_store
from reconciler.adapters.store import attempt_dir, data_dir_for, harvest_skipped
from reconciler.cli._boxes import BoxAccess, read_fleet_facts
from reconciler.cli._common import add_data_dir_arg, add_live_args, api_url_of, store_of
from reconciler.core.bounds import COMMAND_STDOUT_BYTES
from reconciler.core.model import Endpoint
from reconciler.errors import HostKeyMismatch, HostUnreachable, RemoteCommandFailed, UserError
from reconciler.observed.run_lookup import AttemptPlace
from reconciler.ports import ResultStore, Shell
from reconciler.remote import NO_SUCH_RUN_EXIT
from reconciler.remote.logs import (
    EXIT_CODE_FILE,
    MAX_SLICE_BYTES,
    TAIL_WINDOW_BYTES,
    LogSlice,
    LogStream,
    parse_log_slice,
    read_log_script,
)

POLL_S = 1.0  # --follow: how often the box is asked for new bytes
READ_TIMEOUT_S = 30.0
JSON_TEXT_BYTES = 1 << 20  # --json (and the MCP tool): at most the log's last this many bytes
FOLLOW_RETRIES = 2  # --follow: a dropped connection is tried again this many times (POLL_S apart) before giving up


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Print the log of RUN's latest attempt (or RUN.ATTEMPT): from the local result store when the "
        "harvest brought it home, else from the box over SSH. RUN is a run id or a unique prefix of it."
    )
    p.add_argument("target", metavar="RUN[.ATTEMPT]", help="a run id or unique prefix (tdmpc-9165, 9165e5), .N for "
                   "attempt N (default: the latest)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the attempt ends")
    p.add_argument("--stderr", action="store_true", help="the attempt's stderr.log instead of stdout.log")
    p.add_argument("--tail", type=_non_negative, default=None, metavar="N",
                   help=f"start with the last N lines (at most the log's last {TAIL_WINDOW_BYTES >> 20} MiB)")
    p.add_argument("--raw", action="store_true",
                   help="write the log's bytes as they are (default: control characters shown as escapes)")
    p.add_argument("--json", action="store_true", help="print the log as it is now as one JSON object "
                   "(run_id, attempt, stream, source, exit_code, text)")
    add_data_dir_arg(p)
    add_live_args(p)
    p.set_defaults(handler=run)


def _non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative")
    return n


# ------------------------------------------------------------------------------------------------- sources


class LogSource(Protocol):
    def read(self, offset: int, last_lines: int | None) -> LogSlice: ...

    @property
    def finished(self) -> bool:
        """The attempt is known to have ended whatever ``read`` says (its logs were harvested)."""
        ...


class StoreSource:
    """A harvested attempt: its run directory as the harvest put it into the result store, read through the port
    in bounded slices (a 2 GiB log never comes whole, from a local directory or an object store alike)."""

    finished = True

    def __init__(
        self, store: ResultStore, run_id: str, attempt: int, stream: LogStream, exit_code: int | None = None
    ) -> None:
        self.file = StoredFile(store, run_id, attempt, stream.value)
        self.exit_code = exit_code
        with contextlib.suppress(ValueError, TypeError):
            code = store.read_attempt(run_id, attempt, EXIT_CODE_FILE)
            if code is not None and len(code) < 32:
                self.exit_code = int(code.decode("ascii", "replace").strip())

    def read(self, offset: int, last_lines: int | None) -> LogSlice:
        fh = self.file
        size = fh.size()
        if size is None:
            return LogSlice(b"", 0, 0, 0, self.exit_code, False)
        if last_lines is not None:
            offset = _last_lines_start(fh, size, last_lines)
        offset = min(offset, size)
        fh.seek(offset)
        data = fh.read(min(MAX_SLICE_BYTES, size - offset))
        return LogSlice(data, offset, offset + len(data), size, self.exit_code, False)


class StoredFile:
    """A harvested file as a seekable reader over ``ResultStore.read_range`` (what ``_last_lines_start`` needs)."""

    def __init__(self, store: ResultStore, run_id: str, attempt: int, name: str) -> None:
        self.store, self.run_id, self.attempt, self.name = store, run_id, attempt, name
        self.pos = 0
        self._size: int | None = None
        self._known = False

    def size(self) -> int | None:
        """The file's size; None when it is not in the store."""
        if not self._known:
            got = self.store.read_range(self.run_id, self.attempt, self.name, 0, 0)
            self._size, self._known = (got[1] if got is not None else None), True
        return self._size

    def seek(self, pos: int) -> int:
        self.pos = max(0, pos)
        return self.pos

    def read(self, n: int) -> bytes:
        got = self.store.read_range(self.run_id, self.attempt, self.name, self.pos, n)
        data = got[0] if got is not None else b""
        self.pos += len(data)
        return data


class _Seekable(Protocol):
    def seek(self, pos: int, /) -> int: ...

    def read(self, n: int, /) -> bytes: ...


def _last_lines_start(fh: _Seekable, size: int, lines: int) -> int:
    """The offset where the last ``lines`` lines of the file's first ``size`` bytes start (as ``tail -n``)."""
    if lines == 0 or size == 0:
        return size
    pos, seen, block = size, 0, 1 << 16
    fh.seek(size - 1)
    # a final newline ends the last line; it does not start another one
    if fh.read(1) == b"\n":
        pos -= 1
    floor = max(0, size - TAIL_WINDOW_BYTES)  # as on the box: a log is never read whole for its last lines
    while pos > floor:
        step = min(block, pos - floor)
        fh.seek(pos - step)
        chunk = fh.read(step)
        at = len(chunk)
        while True:
            at = chunk.rfind(b"\n", 0, at)
            if at < 0:
                break
            seen += 1
            if seen == lines:
                return pos - step + at + 1
        pos -= step
    return floor


class BoxSource:
    """A live (or not yet harvested) attempt, read on its box over SSH."""

    finished = False

    def __init__(self, shell: Shell, endpoint: Endpoint, instance_id: int, place: AttemptPlace,
                 stream: LogStream, *, retries: int = 0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.shell = shell
        self.endpoint = endpoint
        self.instance_id = instance_id
        self.place = place
        self.stream = stream
        self.retries = retries
        self.sleep = sleep

    def read(self, offset: int, last_lines: int | None) -> LogSlice:
        command = read_log_script(self.place.run_id, self.place.attempt, self.stream, offset=offset,
                                  last_lines=last_lines)
        where = f"box {self.instance_id} ({self.endpoint.host}:{self.endpoint.port})"
        for tried in range(self.retries + 1):
            try:
                # a slice, plus room for the reader's header and a login banner before it
                res = self.shell.run(
                    self.endpoint, command, timeout=READ_TIMEOUT_S, max_stdout=MAX_SLICE_BYTES + COMMAND_STDOUT_BYTES
                )
                break
            except HostKeyMismatch as exc:
                raise UserError(f"{where}: {exc}") from exc
            except HostUnreachable as exc:
                if tried >= self.retries:
                    raise UserError(f"{where} is unreachable: {exc}") from exc
                self.sleep(POLL_S)
        if res.exit_code == NO_SUCH_RUN_EXIT:
            raise UserError(f"{where} has no run directory for attempt {self.place.name}")
        if res.exit_code != 0:
            err = res.stderr.decode("utf-8", "replace").strip()[-300:]
            raise RemoteCommandFailed(f"{where}: reading the log exited {res.exit_code}: {err}")
        return parse_log_slice(res.stdout)


# ------------------------------------------------------------------------------------------------ printing


class Printer:
    """Where the log's bytes go: decoded and written to the CLI's (escaping) stdout, or as bytes with ``raw``."""

    def __init__(self, *, raw: bool) -> None:
        self.raw = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")

    def __call__(self, data: bytes) -> None:
        if self.raw:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(self._decoder.decode(data))
            sys.stdout.flush()

    def close(self) -> None:
        if not self.raw:
            rest = self._decoder.decode(b"", final=True)
            if rest:
                sys.stdout.write(rest)
            sys.stdout.flush()


def pump(
    source: LogSource,
    write: Callable[[bytes], None],
    *,
    follow: bool,
    tail: int | None = None,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
    start: int = 0,
    on_tail: Callable[[LogSlice], None] = lambda sl: None,
) -> LogSlice:
    """Copy the log from ``source`` to ``write``: what is there now, or with ``follow`` until the attempt ended.

    Returns the last slice read (its ``exit_code`` says how the attempt ended, if it did). Without ``follow`` the
    log is read up to the size it had at the first read, so a busy log cannot keep the command running. With
    ``follow`` it ends when the exit code appears or the source is finished, and when the wrapper is gone without
    an exit code on two reads in a row (the wrapper writes the exit code just before it exits). With ``tail``, the
    first slice (where the last lines start) is also handed to ``on_tail``.
    """
    offset, target, gone = start, -1, 0
    last_lines = tail
    while True:
        sl = source.read(offset, last_lines)
        if last_lines is not None:
            on_tail(sl)
        last_lines = None
        if sl.data:
            write(sl.data)
        offset = sl.end
        if target < 0:
            target = sl.size
        if not follow:
            if offset >= min(target, sl.size):
                return sl
            continue
        if sl.end < sl.size:
            continue  # more is there already
        if sl.ended or source.finished:
            return sl
        gone = gone + 1 if sl.wrapper_alive is False else 0
        if gone >= 2:
            return sl
        sleep(poll_s)


# ------------------------------------------------------------------------------------------------- command


def _open(args: argparse.Namespace) -> tuple[AttemptPlace, LogStream, BoxAccess, LogSource]:
    """The attempt ``args.target`` names, its stream, the box access (close it) and where its log is read from."""
    api_url = api_url_of(args)
    facts = read_fleet_facts(args)
    place = facts.index.resolve(args.target)
    stream = LogStream.STDERR if args.stderr else LogStream.STDOUT
    config = store_of(args)
    store = open_store(config, facts.desired.fleet.name, args.data_dir)
    stored = (
        f"{config.where()}, attempt {place.name}" if config is not None
        else str(attempt_dir(data_dir_for(facts.desired.fleet.name, args.data_dir), place.run_id, place.attempt))
    )
    boxes = BoxAccess(facts, api_url)
    retries = FOLLOW_RETRIES if args.follow else 0
    try:
        source: LogSource
        got = store.harvested(place.run_id, place.attempt)
        left_behind = harvest_skipped(got, stream.value) if got is not None else None
        if got is not None and left_behind is None:
            source = StoreSource(store, place.run_id, place.attempt, stream,
                                 place.record.exit_code if place.record else None)
        elif left_behind is not None:
            # harvested, but without this log (a 2 GiB stderr.log is over the harvest's cap): its box may still
            # have it; printing the empty store copy would say the log is empty
            try:
                source = _box_source(boxes, place, stream, stored, retries=retries)
            except UserError as exc:
                raise UserError(f"attempt {place.name}'s {stream.value} was not harvested ({left_behind}), and its "
                                f"box cannot give it: {exc}") from exc
        else:
            source = _box_source(boxes, place, stream, stored, retries=retries)
    except BaseException:
        boxes.close()
        raise
    return place, stream, boxes, source


def logs_json(args: argparse.Namespace) -> dict[str, object]:
    """What ``--json`` prints: the log as it is now (no following), decoded, with where it came from and the
    exit code when known (``rigsync mcp``'s ``logs`` returns the same)."""
    place, stream, boxes, source = _open(args)
    chunks: list[bytes] = []

    def keep(data: bytes) -> None:  # what was read, its last JSON_TEXT_BYTES held at most (twice that, briefly)
        chunks.append(data)
        if sum(map(len, chunks)) > 2 * JSON_TEXT_BYTES:
            kept = b"".join(chunks)
            chunks[:] = [kept[-JSON_TEXT_BYTES:]]
            dropped[0] += len(kept) - JSON_TEXT_BYTES

    dropped = [0]
    try:
        # one JSON answer holds at most the log's last JSON_TEXT_BYTES (a 2 GiB log must not come home whole)
        size = source.read(0, 0).size
        start = max(0, size - JSON_TEXT_BYTES) if args.tail is None else 0
        last = pump(source, keep, follow=False, tail=args.tail, start=start)
    finally:
        boxes.close()
    data = b"".join(chunks)
    cut = max(0, len(data) - JSON_TEXT_BYTES)
    doc: dict[str, object] = {
        "run_id": place.run_id,
        "attempt": place.attempt,
        "stream": stream.value,
        "source": "store" if isinstance(source, StoreSource) else "box",
        "exit_code": last.exit_code,
        "text": data[cut:].decode("utf-8", "backslashreplace"),
    }
    if start + dropped[0] + cut:
        doc["omitted_bytes"] = start + dropped[0] + cut
    return doc


def run(args: argparse.Namespace) -> int:
    if args.json:
        if args.follow:
            raise UserError("--json prints the log as it is now: it does not combine with --follow")
        print(json.dumps(logs_json(args), indent=2, sort_keys=True))
        return 0
    place, _, boxes, source = _open(args)
    try:
        printer = Printer(raw=args.raw)
        try:
            last = pump(source, printer, follow=args.follow, tail=args.tail,
                        on_tail=lambda sl: _say_tail_cut(sl, args.tail))
        except BrokenPipeError:  # `rigsync logs ... | head`: the reader has what it wanted
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        printer.close()
    finally:
        boxes.close()
    if args.follow:
        if last.exit_code is not None:
            print(f"rigsync: attempt {place.name} ended with exit code {last.exit_code}", file=sys.stderr)
        elif source.finished:
            print(f"rigsync: attempt {place.name} ended (no exit code recorded)", file=sys.stderr)
        else:
            print(f"rigsync: attempt {place.name} ended without an exit code: its wrapper is gone (killed, or its "
                  "box restarted)", file=sys.stderr)
    return 0


def tail_cut(sl: LogSlice) -> bool:
    """Whether a ``--tail`` read starts at its byte bound (``TAIL_WINDOW_BYTES`` before the end): the lines asked
    for did not all fit, so the first one shown is the end of a longer line."""
    return 0 < sl.start == sl.size - TAIL_WINDOW_BYTES


def _say_tail_cut(sl: LogSlice, lines: int | None) -> None:
    if tail_cut(sl):
        print(f"rigsync: the last {lines} line(s) are longer than {TAIL_WINDOW_BYTES >> 20} MiB: only the log's last "
              f"{TAIL_WINDOW_BYTES >> 20} MiB shown", file=sys.stderr, flush=True)


def _box_source(boxes: BoxAccess, place: AttemptPlace, stream: LogStream, stored: str, *, retries: int) -> BoxSource:
    if place.instance_id is None:
        raise UserError(f"rigsync does not know which box attempt {place.name} ran on, and its logs were not "
                        f"harvested (nothing at {stored})")
    instance = boxes.listed(place.instance_id)
    if instance is None:
        raise UserError(f"box {place.instance_id} was destroyed and its logs were not harvested (attempt "
                        f"{place.name}: nothing at {stored})")
    instance = boxes.owned(instance)
    if instance.ssh is None:
        raise UserError(f"box {instance.id} has no SSH address yet (the provider says {instance.status.value})")
    return BoxSource(boxes.shell(), instance.ssh, instance.id, place, stream, retries=retries)
