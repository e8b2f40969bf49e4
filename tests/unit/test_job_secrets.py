"""The job-secrets allowlist (``RIGSYNC_JOB_SECRETS``, ``core.jobenv``): the parser's refusals, a name off the
list never read by the controller, and the held-back reason where people see it (status, the commit message).

The plan rule itself is stated as data: ``plan_cases/secret_not_allowed.json``, ``secret_missing.json`` (on the
list, not set) and ``secret_present.json`` (on the list and set). End to end: ``tests/integration/test_secrets.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from reconciler.cli import main
from reconciler.core import jobenv
from reconciler.core.jobenv import JOB_SECRETS_ENV, ControllerEnv, allowed_secrets, held_back
from reconciler.errors import SecretMissing, SecretNotAllowed, UserError
from reconciler.observed.codec import STATUS
from reconciler.observed.summary import describe_change
from reconciler.plan.render import status_text

ENV = (("T", "${GITHUB_TOKEN}"), ("WANDB_API_KEY", "${WANDB_API_KEY}"), ("MUJOCO_GL", "egl"))


class _Watched(Mapping[str, str]):
    """A controller environment that remembers every name read from it."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.read: list[str] = []

    def __getitem__(self, key: str) -> str:
        self.read.append(key)
        return self.values[key]

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.read.append(key)
        return self.values.get(key, default)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the controller's environment is never listed")

    def __len__(self) -> int:
        return len(self.values)


def test_the_list_is_comma_separated_names_and_unset_allows_nothing() -> None:
    assert allowed_secrets(" WANDB_API_KEY, HF_TOKEN ,,") == frozenset({"WANDB_API_KEY", "HF_TOKEN"})
    assert allowed_secrets("") == frozenset()
    assert ControllerEnv({}).allowed == frozenset()
    assert ControllerEnv({JOB_SECRETS_ENV: "HF_TOKEN"}).allowed == frozenset({"HF_TOKEN"})
    # where review runs: unset is "not known", set (even empty) is the list
    assert jobenv.allowlist_given({}) is None
    assert jobenv.allowlist_given({JOB_SECRETS_ENV: ""}) == frozenset()
    assert jobenv.allowlist_given({JOB_SECRETS_ENV: "HF_TOKEN"}) == frozenset({"HF_TOKEN"})


@pytest.mark.parametrize(
    "name", ["VAST_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "RIGSYNC_API_URL"]
)
def test_a_name_that_is_never_a_jobs_is_refused_naming_the_variable_and_the_name(name: str) -> None:
    assert name in jobenv.REFUSED_REFERENCES or name.startswith(jobenv.RIGSYNC_PREFIX)
    with pytest.raises(UserError) as caught:
        allowed_secrets(f"HF_TOKEN,{name}")
    assert JOB_SECRETS_ENV in str(caught.value) and name in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError):
        ControllerEnv({JOB_SECRETS_ENV: name})  # refused when the controller is made, not dropped silently


@pytest.mark.parametrize("entry", ["WANDB_API_KEY=hunter2-s3cr3t", "wandb_api_key", "1X", "HF TOKEN"])
def test_an_entry_that_is_no_name_is_refused_without_quoting_it(entry: str) -> None:
    with pytest.raises(UserError) as caught:
        allowed_secrets(f"HF_TOKEN,{entry}")
    said = str(caught.value)
    assert JOB_SECRETS_ENV in said and "entry 2" in said
    assert entry not in said and "hunter2" not in said  # a value pasted by mistake is not echoed


def test_a_name_off_the_list_is_never_read_nor_resolved() -> None:
    environ = _Watched({JOB_SECRETS_ENV: "WANDB_API_KEY", "GITHUB_TOKEN": "ghtok-canary", "WANDB_API_KEY": "w"})
    env = ControllerEnv(environ)
    assert env.available(["GITHUB_TOKEN", "WANDB_API_KEY"]) == frozenset({"WANDB_API_KEY"})
    with pytest.raises(SecretNotAllowed) as caught:
        env.resolve("tdmpc", ENV)
    said = str(caught.value)
    assert "tdmpc" in said and "GITHUB_TOKEN" in said and JOB_SECRETS_ENV in said and "ghtok-canary" not in said
    assert "WANDB_API_KEY" not in said  # the allowed one is not the problem
    assert isinstance(caught.value, SecretMissing)  # apply's handling of a launch without its secret holds
    assert "GITHUB_TOKEN" not in environ.read, environ.read
    allowed = ControllerEnv({JOB_SECRETS_ENV: "WANDB_API_KEY,GITHUB_TOKEN", "GITHUB_TOKEN": "g", "WANDB_API_KEY": "w"})
    assert allowed.resolve("tdmpc", ENV).items() == (("T", "g"), ("WANDB_API_KEY", "w"), ("MUJOCO_GL", "egl"))


def test_a_bad_list_stops_the_controller_at_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(JOB_SECRETS_ENV, "HF_TOKEN,AWS_SECRET_ACCESS_KEY")
    assert main(["run", "--once", "--repo", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert JOB_SECRETS_ENV in err and "AWS_SECRET_ACCESS_KEY" in err
    assert out == ""  # nothing else happened: no lease, no cycle


WARNINGS = [
    "budget: the daily cap binds",
    "secret not allowed: " + jobenv.not_allowed_text("tdmpc", ["GITHUB_TOKEN"]) + ": 1 run(s) not launched",
    "secret missing: " + jobenv.missing_text("probe", ["HF_TOKEN"]) + ": 2 run(s) not launched",
]


def test_held_back_sweeps_carry_their_reason_code() -> None:
    not_allowed, missing = held_back(WARNINGS)
    assert not_allowed.startswith("sweep tdmpc references GITHUB_TOKEN") and not_allowed.endswith(
        "(secret_not_allowed)"
    )
    assert missing.startswith("sweep probe needs HF_TOKEN") and missing.endswith("(secret_missing)")
    doc = {"fleet": "lab", "boxes": [], "foreign": [], "dph": 0.0, "runs": {}, "spend": {"today_usd": 0.0,
           "total_usd": 0.0}, "blocked": [not_allowed, missing]}
    assert f"BLOCKED: {not_allowed}" in status_text(doc).splitlines()


def test_the_commit_message_says_a_sweep_is_newly_held_back() -> None:
    def status(warnings: list[str]) -> dict[str, str]:
        return {STATUS: yaml.safe_dump({"last_plan": {"warnings": warnings}})}

    message = describe_change(status(WARNINGS[:1]), status(WARNINGS))
    assert message is not None
    assert "held back: sweep tdmpc references GITHUB_TOKEN" in message and "(secret_not_allowed)" in message
    assert "(secret_missing)" in message
    assert describe_change(status(WARNINGS), status(WARNINGS)) is None  # said once, not every cycle
