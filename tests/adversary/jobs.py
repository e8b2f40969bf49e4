"""A job that misbehaves on purpose: the sweep's command in the adversary corpus, one mode per grid cell.

The text ``JOB`` is written into the fleet repository's ``experiments/`` (the code rigsync ships to a box) and
run by the sweep's command with ``--mode``. Standard library only, as any job on a box. Each mode is one of the
issue's adversaries; what the controller must do about each is asserted by the tests, not here.

* ``honest``: a few finite metric lines, exit 0 (the rest of the fleet must converge).
* ``pid1``: starts a sentinel (``adv-sentinel-job-<run id>``, in a session of its own), writes ``1`` into its
  pid file (PID 1 of the box's namespace is its sshd) and stops the heartbeat, then sleeps forever: a requeue
  that trusts the pid file runs ``kill -- -1``, which ends the sentinel too.
* ``future``: stops the heartbeat loop (which is also the box-side max-runtime guard) and dates ``started_at`` and
  the heartbeat ten days ahead, then sleeps forever: only the controller's own clock can end it.
* ``nonfinite``: metric lines with ``NaN``, ``Infinity``, ``-Infinity``, ``1e400``, ``1e308`` and a step of
  10^400, plus ESC, C1, BEL and bidi characters on stderr; exit 0.
* ``stderr``: fails (exit 3) after writing ESC sequences, an OSC title with BEL, C1, bidi overrides and HTML to
  stderr, so its record carries them as its stderr tail.
* ``garbage_exit``: ends its whole session (the wrapper too, so it records nothing) after writing an exit code
  of 10^29 and an ``ended_at`` in the year 33658.
* ``harvest``: artifacts and a checkpoint directory holding a sparse 1 GiB file, 200,000 files, symlinks out of
  the run directory (absolute, ``../``), a FIFO and a device node; exit 0 after a few checkpoint syncs.
* ``flood``: one 200 MB line in metrics.jsonl and 200 MB of stdout and stderr, then exit 0 (the memory test).
"""

from __future__ import annotations

JOB = r'''
"""Adversary job (rigsync's issue 20 corpus): misbehaves as --mode says."""
import argparse
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True)
p.add_argument("--out", required=True)
p.add_argument("--files", type=int, default=200000)
a = p.parse_args()
run_dir = os.environ.get("RIGSYNC_RUN_DIR") or os.path.dirname(a.out)
TEN_DAYS = 10 * 86400


def line(obj_text):
    with open(a.out, "a") as f:
        f.write(obj_text + "\n")


def ancestors():
    out, pid = set(), os.getpid()
    for _ in range(64):
        out.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
    return out


def session_members():
    sid = os.getsid(0)
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open("/proc/%s/stat" % e) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                out.append(int(e))
    return out


def stop_heartbeat(also_ancestors=False):
    """End the wrapper's heartbeat loop (a sibling in this session), and with also_ancestors the wrapper too."""
    keep = {os.getpid()} if also_ancestors else ancestors()
    for _ in range(3):
        for pid in session_members():
            if pid not in keep:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def running(marker):
    for e in os.listdir("/proc"):
        if e.isdigit():
            with contextlib.suppress(OSError):
                with open("/proc/%s/cmdline" % e, "rb") as f:
                    if f.read().startswith(marker.encode()):
                        return True
    return False


def write(name, text):
    with open(os.path.join(run_dir, name), "w") as f:
        f.write(text)


def forever():
    while True:
        time.sleep(3600)


mode = a.mode
if mode == "honest":
    for i in range(1, 4):
        line(json.dumps({"step": i, "episode_reward": 10.0 * i}))
        time.sleep(0.7)
elif mode == "pid1":
    line(json.dumps({"step": 1, "episode_reward": 1.0}))
    # an unrelated process in a session of its own, up before the pid is forged: a kill -- -1 ends it
    marker = "adv-sentinel-job-" + os.environ.get("RIGSYNC_RUN_ID", "x")
    subprocess.call(["setsid", "-f", "bash", "-c", "exec -a %s sleep 100000" % marker],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # wait for it to be exec'd (so out of this session) before ending this session's other processes
    for _ in range(100):
        if running(marker):
            break
        time.sleep(0.05)
    stop_heartbeat()
    write("pid", "1\n")
    forever()
elif mode == "future":
    line(json.dumps({"step": 1, "episode_reward": 2.0}))
    stop_heartbeat()
    later = time.time() + TEN_DAYS
    write("started_at", "%.3f\n" % later)
    hb = os.path.join(run_dir, "heartbeat")
    while True:
        with contextlib.suppress(OSError):
            os.utime(hb, (later, later))
        time.sleep(1)
elif mode == "nonfinite":
    line('{"step": 1, "episode_reward": 5.0}')
    line('{"step": 2, "episode_reward": NaN}')
    line('{"step": 3, "episode_reward": Infinity}')
    line('{"step": 4, "episode_reward": -Infinity}')
    line('{"step": 1' + "0" * 400 + ', "episode_reward": 1e400}')
    line('{"step": 6, "episode_reward": 1e308, "nan": NaN}')
    sys.stderr.write("\x1b[31mred\x1b[0m \u202eevil\u202c \x07bell \x9bc1 \u2066iso\u2069\n")
elif mode == "stderr":
    line(json.dumps({"step": 1, "episode_reward": 6.0}))
    sys.stderr.write("\x1b[2J\x1b]0;owned\x07 \u202egnp.exe\u202c \x9b31m \u2066iso\u2069 <b>&amp;</b>\n" * 3)
    sys.exit(3)
elif mode == "garbage_exit":
    line(json.dumps({"step": 1, "episode_reward": 3.0}))
    write("exit_code", "1" + "0" * 28 + "\n")
    write("ended_at", "999999999999.5\n")
    sys.stdout.flush()
    stop_heartbeat(also_ancestors=True)
elif mode == "harvest":
    line(json.dumps({"step": 1, "episode_reward": 4.0}))
    for sub in ("out", "ckpt"):
        d = os.path.join(run_dir, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "sparse.bin"), "wb") as f:
            f.truncate(1 << 30)
        for name, target in (("passwd", "/etc/passwd"), ("up", "../../../../../../.."), ("root", "/")):
            with contextlib.suppress(OSError):
                os.symlink(target, os.path.join(d, name))
        with contextlib.suppress(OSError):
            os.mkfifo(os.path.join(d, "fifo"))
        with contextlib.suppress(OSError):
            os.mknod(os.path.join(d, "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    many = os.path.join(run_dir, "out", "many")
    os.makedirs(many, exist_ok=True)
    for i in range(a.files):
        os.close(os.open(os.path.join(many, "f%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
    time.sleep(4)
    line(json.dumps({"step": 2, "episode_reward": 4.5}))
elif mode == "flood":
    chunk = "9" * (1 << 20)
    with open(a.out, "a") as f:
        f.write('{"step": 1, "episode_reward": 1.0, "pad": "')
        for _ in range(200):
            f.write(chunk)
        f.write('"}\n')
    for stream in (sys.stdout, sys.stderr):
        for _ in range(200):
            stream.write(chunk)
        stream.flush()
else:
    raise SystemExit("unknown mode " + mode)
'''
