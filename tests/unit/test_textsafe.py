"""Reviewer-facing text never carries raw control or bidi characters, and markdown fences cannot be closed by a value.

Hostile values (an ANSI colour sequence, the C1 CSI, DEL, a carriage return, the bidi overrides and isolates, runs
of backticks) are fed through every output rigsync writes for a person: the CLI's stdout and stderr (``diff``,
``runs``, ``plan`` and ``status`` text, error lines), the PR comment sections, and the commit messages of ``run``.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from reconciler.cli import main
from reconciler.core.actions import Destroy, Plan, ReasonCode
from reconciler.core.textsafe import SafeStream, has_hazard, md_fenced, md_inline, md_section, visible
from reconciler.plan.render import plan_text, status_text

ROOT = Path(__file__).resolve().parents[2]
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HOSTILE = f"evil\x1b[31mRED\x1b[0m \x9b2J \x7f\r{BIDI} ``` ````` <b>x</b> \x00\x07\x08"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + BIDI + "\u2028\u2029]")


def assert_clean(text: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in RAW.findall(text)})
    assert not found, f"raw control/bidi characters in output: {found}"


def test_visible_escapes_every_control_and_bidi_character() -> None:
    out = visible(HOSTILE)
    assert_clean(out)
    assert "\\x1b[31mRED" in out and "\\u009b2J" in out and "\\u007f" in out and "\\x0d" in out
    assert "\\u202e" in out and "\\u2066" in out and "\\u061c" in out and "\\x00" in out
    assert visible("a\tb\nc", block=True) == "a\tb\nc"
    assert visible("a\tb\nc") == "a\\x09b\\x0ac"
    assert visible("plain ASCII, ünïcödé, 日本") == "plain ASCII, ünïcödé, 日本"
    assert has_hazard("x\u202ey") and not has_hazard("x\ny")
    assert visible(visible(HOSTILE)) == visible(HOSTILE)  # escapes are plain ASCII: idempotent


def test_the_u_escapes_keep_json_meaning_the_same() -> None:
    import json

    doc = json.dumps({"label": "a\u202eb\x9bc\x7fd"}, ensure_ascii=False)
    assert json.loads(visible(doc, block=True)) == json.loads(doc)


def _fence_of(block: str) -> tuple[str, list[str]]:
    lines = block.splitlines()
    fence = lines[0]
    assert set(fence) == {"`"}
    closing = [i for i, line in enumerate(lines[1:], 1) if line.startswith(fence)]
    return fence, [lines[i] for i in closing]


@pytest.mark.parametrize("run", [0, 1, 2, 3, 4, 7])
def test_a_fence_is_longer_than_any_backtick_run_in_its_text(run: int) -> None:
    text = f"line one\n{'`' * run}\ninline {'`' * run}x{'`' * run} and\n{'`' * run} closing?"
    block = md_fenced(text)
    fence, closing = _fence_of(block)
    assert len(fence) == max(3, run + 1)
    assert closing == [fence] and block.endswith(f"\n{fence}\n")  # only the real closing line closes it


def test_values_outside_fences_are_escaped_markdown() -> None:
    out = md_inline("**bold** [link](http://x) <img src=x> `code` #h \u202e")
    assert re.search(r"(?<!\\)[*\[\]<>`#()]", out) is None  # every markdown character is backslash-escaped
    assert "\\<img" in out and "\\`code\\`" in out
    assert "\\\\u202e" in out  # the escape's own backslash is escaped: it renders as the text \u202e
    assert md_section("Runs", "a ``` b").startswith("### Runs\n````\n")


def test_the_cli_streams_make_everything_visible() -> None:
    buf = io.StringIO()
    stream = SafeStream(buf)
    assert stream.write(HOSTILE + "\n") == len(HOSTILE) + 1
    assert_clean(buf.getvalue())
    assert buf.getvalue().endswith("\n")


def test_plan_and_status_text_through_the_cli_stream() -> None:
    p = Plan(actions=(Destroy(reason=f"unreachable ({HOSTILE})", code=ReasonCode.UNREACHABLE_PAST_GRACE,
                              instance_id=1),), warnings=(f"host key changed on instance/1: {HOSTILE}",))
    doc = {
        "fleet": "lab", "dph": 0.1, "runs": {"pending": 1},
        "boxes": [{"id": 5, "status": "running", "gpu": "1x RTX 3090", "dph": 0.1, "reachable": False,
                   "host_key_changed": True, "runs": []}],
        "foreign": [{"id": 9, "label": HOSTILE}], "spend": {"today_usd": 0.0, "total_usd": 0.0},
        "credit_usd": None, "price": [], "budget": [],
    }
    for text in (plan_text(p, show_noops=True), status_text(doc)):
        buf = io.StringIO()
        print(text, file=SafeStream(buf))  # what `rigsync plan` / `rigsync status` print goes through this
        assert_clean(buf.getvalue())
        assert "\\x1b[31m" in buf.getvalue() and "\\u202e" in buf.getvalue()
    assert "HOST KEY CHANGED (untrusted)" in status_text(doc)


def _fleet_dir(tmp_path: Path) -> Path:
    repo = tmp_path / "fleet"
    shutil.copytree(ROOT / "desired", repo / "desired")
    shutil.copytree(ROOT / "observed", repo / "observed")
    # the example sweep ships code: [experiments]; the loader checks that the path exists
    shutil.copytree(ROOT / "experiments", repo / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def test_diff_text_and_markdown_escape_world_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _fleet_dir(tmp_path)
    drift = repo / "observed" / "drift.yaml"
    doc = yaml.safe_load(drift.read_text())
    doc["drift"] = [{"class": "unreachable", "subject": "instance/7", "detail": f"ssh said: {HOSTILE}",
                     "action": "none"}]
    drift.write_text(yaml.safe_dump(doc, allow_unicode=True))
    assert RAW.search(drift.read_text().replace("\n", "")) is not None  # the file really holds them raw

    assert main(["diff", "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "ssh said: evil\\x1b[31mRED" in out and "\\u202e" in out

    assert main(["diff", "--repo", str(repo), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert_clean(md)
    assert md.startswith("### rigsync: desired vs observed\n")
    fence, closing = _fence_of(md.split("\n", 1)[1])
    assert len(fence) == 6 and closing == [fence]  # the value's run of five backticks cannot close it


def test_runs_markdown_fence_survives_backticks_in_a_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _fleet_dir(tmp_path)
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    text = sweep.read_text()
    text = text.replace("command: >-\n", "command: >-\n  echo '````' &&\n", 1)
    sweep.write_text(text)
    assert main(["runs", "--repo", str(repo), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### Runs this revision asks for\n")
    fence, closing = _fence_of(md.split("\n", 1)[1])
    assert len(fence) == 5 and closing == [fence]
    assert "echo '````'" in md


def test_error_lines_go_through_the_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "no\x1b]8;;http://x\x07such\u202e"
    assert main(["diff", "--repo", str(bad)]) == 1
    err = capsys.readouterr().err
    assert_clean(err)
    assert "no\\x1b]8;;http:/x\\x07such\\u202e: not a directory" in err


def test_commit_messages_are_made_visible(tmp_path: Path) -> None:
    from reconciler.adapters.git import GitRepo

    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    g = GitRepo(repo, author_name="t", author_email="t@example.invalid")
    sha = g.commit_observed({"observed/status.yaml": "x: 1\n"}, {}, f"observe: lease taken over from {HOSTILE}")
    assert sha is not None
    msg = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%B"], capture_output=True, text=True,
                         check=True).stdout
    assert_clean(msg)
    assert "\\x1b[31mRED" in msg and "\\u202e" in msg


def test_observed_files_and_archive_lines_hold_escapes_not_raw_characters() -> None:
    import json

    from reconciler.core.model import AttemptOutcome, AttemptRecord
    from reconciler.observed.archive_lines import record_from_json, record_to_json
    from reconciler.observed.codec import dump_yaml, load_yaml

    doc = {"drift": [{"detail": f"api said {HOSTILE}", "subject": "instance/1"}], "name": "ünï"}
    text = dump_yaml(doc, "header")
    assert_clean(text)
    assert load_yaml(text, "observed/drift.yaml") == doc  # the same values
    assert "ünï" in dump_yaml({"name": "ünï"}, "header")  # plain unicode is still written as it is

    rec = AttemptRecord(run_id="r1", attempt=1, sweep="s", phase=AttemptOutcome.LOST, reason=f"box said {HOSTILE}",
                        gpu_name="RTX\u202e 3090")
    line = record_to_json(rec)
    assert_clean(line)
    assert json.loads(line)["reason"] == rec.reason and record_from_json(line) == rec
