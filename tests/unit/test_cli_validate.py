"""``rigsync validate`` and ``rigsync runs`` as a user runs them: the real console script in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RIGSYNC = Path(sys.executable).parent / "rigsync"  # the console script of the running environment


def rigsync(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    # The timeout only guards against a hang (billion laughs and friends); it is not a speed assertion.
    result = subprocess.run([str(RIGSYNC), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    return result


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "desired", tmp_path / "desired")
    # The example sweep ships code: [experiments]; the loader checks that the path exists.
    shutil.copytree(REPO / "experiments", tmp_path / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_validate_example_human() -> None:
    result = rigsync("validate")
    assert result.returncode == 0
    assert "desired state is valid" in result.stdout
    assert "12 run(s)" in result.stdout


def test_validate_example_json(repo: Path) -> None:
    result = rigsync("validate", "--json", cwd=repo)  # --repo defaults to the working directory
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"valid": True, "errors": []}


def test_validate_reports_every_error(repo: Path) -> None:
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    sweep.write_text("name: tdmpc\ncommand: run {{ task }}\ngrid:\n  task: [a, b]\nseeds: [1, x]\nretries: -3\n")
    (repo / "desired" / "stray.txt").write_text("hello\n")
    result = rigsync("validate", "--repo", str(repo))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == [
        "desired/stray.txt: /: unknown file in desired/ (expected fleet.yaml, budget.yaml, sweeps/*.yaml, "
        "README.md and the fleet's bootstrap script)",
        "desired/sweeps/tdmpc.yaml:5:12: /seeds/1: 'x' is not of type 'integer'",
        "desired/sweeps/tdmpc.yaml:6:10: /retries: -3 is less than the minimum of 0",
        "desired state is invalid: 3 error(s)",
    ]

    result = rigsync("validate", "--repo", str(repo), "--json")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert payload["valid"] is False
    assert len(payload["errors"]) == 3
    assert payload["errors"][1] == {
        "file": "desired/sweeps/tdmpc.yaml",
        "line": 5,
        "column": 12,
        "pointer": "/seeds/1",
        "message": "'x' is not of type 'integer'",
    }
    for error in payload["errors"]:
        assert set(error) == {"file", "line", "column", "pointer", "message"}


def test_validate_without_desired_dir(tmp_path: Path) -> None:
    result = rigsync("validate", "--repo", str(tmp_path), "--json")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert payload["valid"] is False
    assert "no desired/ directory" in payload["errors"][0]["message"]


HOSTILE: dict[str, bytes] = {
    "billion_laughs": b"name: lol\n"
    + b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + b"".join(
        f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n".encode() for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    ),
    "non_utf8": b"name: \xff\xfe\n",
    "tabs": b"name: s\ngrid:\n\ttask: [a]\n",
    "list": b"- 1\n- 2\n",
    "scalar": b"just text\n",
    "multi_doc": b"name: a\n---\nname: b\n",
    "deep": b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "huge": b"description: " + b"y" * (300 * 1024) + b"\n",
    "python_object": b"name: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
    "unclosed": b'name: "abc\n',
    "binary": bytes(range(256)),
    # What an adversary found crashing the loader with a traceback before issue 10:
    "escape_in_comment": b'name: s\ncommand: "run {{ seed }}"\nseeds: [1]\n# \x1b[31mnote\n',
    "noncharacter": 'name: s\ncommand: "run {{ seed }}"\nseeds: [1]\n# \ufffe\n'.encode(),
    "grid_param_self": b'name: s\ncommand: "run {{ self }}"\ngrid: {self: [1]}\nseeds: [1]\n',
    "int_past_python_limit": b'name: s\ncommand: "run {{ seed }}"\nseeds: [' + b"9" * 5000 + b"]\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_is_refused_cleanly(repo: Path, name: str) -> None:
    (repo / "desired" / "sweeps" / "tdmpc.yaml").write_bytes(HOSTILE[name])
    result = rigsync("validate", "--repo", str(repo), "--json")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert payload["valid"] is False
    assert payload["errors"], payload
    assert all(e["file"] == "desired/sweeps/tdmpc.yaml" for e in payload["errors"]), payload


def test_runs_json_shape_and_determinism(repo: Path) -> None:
    first = rigsync("runs", "--json")
    assert first.returncode == 0
    runs = json.loads(first.stdout)
    assert len(runs) == 12
    for run in runs:
        assert set(run) == {"id", "sweep", "params", "seed", "command"}
        assert run["sweep"] == "tdmpc"
    assert runs[0]["params"] == {"task": "walker-walk", "lr": 0.0003}
    assert [r["seed"] for r in runs[:3]] == [1, 2, 3]
    # Same input, same output byte for byte, wherever the repository lives.
    second = rigsync("runs", "--json", "--repo", str(repo))
    assert second.stdout == first.stdout


def test_runs_promotions_listed_on_request() -> None:
    result = rigsync("runs", "--json", "--promotions")
    runs = json.loads(result.stdout)
    candidates = [r for r in runs if "promotion_threshold" in r]
    assert len(candidates) == 4 * 5
    assert len(runs) - len(candidates) == 12


def test_runs_human_mentions_candidates() -> None:
    result = rigsync("runs")
    assert result.returncode == 0
    assert "12 run(s) in 1 sweep(s); 20 promotion candidate(s) not listed" in result.stdout
    assert '"$RIGSYNC_PYTHON" experiments/train.py --task walker-walk --lr 0.0003 --seed 1' in result.stdout


def test_runs_grid_edit_keeps_ids(repo: Path) -> None:
    before = {r["id"] for r in json.loads(rigsync("runs", "--json", "--repo", str(repo)).stdout)}
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    sweep.write_text(sweep.read_text().replace("lr: [3.0e-4, 1.0e-3]", "lr: [3.0e-4, 1.0e-3, 3.0e-3]"))
    after = {r["id"] for r in json.loads(rigsync("runs", "--json", "--repo", str(repo)).stdout)}
    assert before < after
    assert len(after) == 18


def test_runs_on_invalid_tree(repo: Path) -> None:
    (repo / "desired" / "budget.yaml").write_text("on_exceed: panic\n")
    result = rigsync("runs", "--repo", str(repo))
    assert result.returncode == 1
    assert "desired/budget.yaml:1:12: /on_exceed: 'panic' is not one of ['drain', 'halt']" in result.stdout


def test_demo_training_script(tmp_path: Path) -> None:
    """experiments/train.py: a deterministic learning curve, quick under RIGSYNC_DEMO_SECONDS, promotable cells."""
    env = {"PATH": "/usr/bin:/bin", "RIGSYNC_DEMO_SECONDS": "0.2", "EMULATOR_SPEED_FACTOR": "2"}
    cells = [(task, lr, seed) for task in ("walker-walk", "cheetah-run") for lr in ("0.0003", "0.001")
             for seed in ("1", "2", "3")]
    again = tmp_path / "again.jsonl"
    outs = [tmp_path / task / lr / seed / "metrics.jsonl" for task, lr, seed in cells] + [again]
    argvs = [["--task", task, "--lr", lr, "--seed", seed] for task, lr, seed in cells]
    argvs.append(["--task", "walker-walk", "--lr", "0.001", "--seed", "3"])  # a second run of one cell
    # all at once: each sleeps through its short curve, and they are independent
    procs = [
        subprocess.Popen([sys.executable, str(REPO / "experiments" / "train.py"), *args, "--out", str(out)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for args, out in zip(argvs, outs, strict=True)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    best: dict[tuple[str, str], float] = {}
    for (task, lr, _), out in zip(cells, outs, strict=False):
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(lines) == 20
        assert [line["step"] for line in lines] == sorted(line["step"] for line in lines)
        assert all(set(line) == {"step", "episode_reward"} for line in lines)
        best[(task, lr)] = max(best.get((task, lr), 0.0), max(line["episode_reward"] for line in lines))
    # The example sweep's promotion rules (>= 600: +5, >= 500: +2, >= 380: +1) hit each tier once.
    assert best[("walker-walk", "0.001")] >= 600
    assert 500 <= best[("walker-walk", "0.0003")] < 600
    assert 380 <= best[("cheetah-run", "0.001")] < 500
    assert best[("cheetah-run", "0.0003")] < 380
    # Deterministic: a second run of one cell writes the same curve.
    assert again.read_text() == (tmp_path / "walker-walk" / "0.001" / "3" / "metrics.jsonl").read_text()


def test_deep_folders_under_desired_are_refused_cleanly(repo: Path) -> None:
    deep = repo / "desired" / "sweeps"
    made = []
    for _ in range(1200):
        deep = deep / "d"
        deep.mkdir()
        made.append(deep)
    try:
        result = rigsync("validate", "--repo", str(repo), "--json")
        assert result.returncode == 1
        errors = json.loads(result.stdout)["errors"]
        assert [e["message"] for e in errors] == ["folders nested deeper than 8 levels in desired/"]
        assert errors[0]["file"] == "desired/sweeps" + "/d" * 7
    finally:
        for folder in reversed(made):  # pytest's own (recursive) rmtree of old temp dirs would overflow on this
            folder.rmdir()


def test_a_symlinked_desired_is_refused_cleanly(repo: Path) -> None:
    (repo / "desired").rename(repo / "elsewhere")
    (repo / "desired").symlink_to("elsewhere")
    result = rigsync("validate", "--repo", str(repo))
    assert result.returncode == 1
    assert "desired: /: desired/ is a symlink; it must be a folder in the repository" in result.stdout
