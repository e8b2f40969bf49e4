"""The bootstrap cache's pure parts: ``bootstrap: {script, cache}`` as the loader builds it, the key rule, the
command builder and the answer parser, the SSH adapter's stdin (URLs there, never on the command line), and
apply's Bootstrap branch with a store that presigns and one that does not. The box side runs on the emulator's
real boxes against a real S3 server: tests/integration/test_bootstrap_cache.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.store import LocalStore
from reconciler.apply import ApplyContext, apply
from reconciler.core.actions import Bootstrap, Plan, ReasonCode
from reconciler.core.identity import bootstrap_cache_key, box_cache_key
from reconciler.core.model import (
    DEFAULT_POOL,
    Budget,
    Desired,
    Endpoint,
    Fleet,
    Instance,
    InstanceStatus,
    Observed,
    Pool,
)
from reconciler.desired import load_desired, read_desired_files
from reconciler.plan.executable import executable
from reconciler.ports import BootstrapCache, CommandResult, Download, Upload

REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32
POOL = Pool(name=DEFAULT_POOL, image="img:1", bootstrap_script="echo hi\n", bootstrap_hash="0123456789abcdef",
            bootstrap_cache=("/opt/venv",))


def box(cuda: float | None = 12.4, image: str = "") -> Instance:
    return Instance(id=7, label="rigsync:f:s-1", status=InstanceStatus.RUNNING, gpu_name="RTX 3060", num_gpus=1,
                    gpu_ram_mib=12288, dph_total=0.1, start_date=0.0, image=image, cuda=cuda,
                    direct=Endpoint("127.0.0.1", 22, "root"))


def test_the_loader_reads_script_and_cache_and_pools_inherit_them() -> None:
    files = dict(read_desired_files(REPO))
    fleet = yaml.safe_load(files["desired/fleet.yaml"])
    fleet["bootstrap"] = {"script": "bootstrap.sh", "cache": ["/opt/venv", "/root/.cache/pip"]}
    fleet["instances"] = {"min": 0, "max": 2}
    fleet["pools"] = [{"name": "a"}, {"name": "b", "bootstrap": "bootstrap.sh"}]
    files["desired/fleet.yaml"] = yaml.safe_dump(fleet).encode()
    a, b = load_desired(files).fleet.pools
    assert a.bootstrap_path == b.bootstrap_path == "desired/bootstrap.sh"
    assert a.bootstrap_hash == b.bootstrap_hash != ""
    assert a.bootstrap_cache == ("/opt/venv", "/root/.cache/pip") and b.bootstrap_cache == ()


def test_the_key_changes_with_script_image_cuda_major_and_paths_only() -> None:
    base = bootstrap_cache_key("h1", "img", 12, ("/opt/venv",))
    assert len(base) == 16 and base == bootstrap_cache_key("h1", "img", 12, ("/opt/venv",))
    others = {
        bootstrap_cache_key("h2", "img", 12, ("/opt/venv",)),
        bootstrap_cache_key("h1", "img2", 12, ("/opt/venv",)),
        bootstrap_cache_key("h1", "img", 11, ("/opt/venv",)),
        bootstrap_cache_key("h1", "img", None, ("/opt/venv",)),
        bootstrap_cache_key("h1", "img", 12, ("/opt/venv", "/root/x")),
    }
    assert base not in others and len(others) == 5
    # a box's key: the CUDA major of its driver (12.1 and 12.4 share one), its listed image before the pool's
    assert box_cache_key(POOL, box(12.1)) == box_cache_key(POOL, box(12.4)) != box_cache_key(POOL, box(11.8))
    assert box_cache_key(POOL, box(None)) == bootstrap_cache_key(POOL.bootstrap_hash, "img:1", None, ("/opt/venv",))
    assert box_cache_key(POOL, box(image="img:2")) != box_cache_key(POOL, box())
    assert box_cache_key(replace(POOL, bootstrap_cache=()), box()) is None


def test_the_builder_refuses_what_the_runner_must_not_be_handed() -> None:
    for path in ("opt/venv", "/", "/opt/../etc", "/opt/ven v", "/opt/venv/"):
        with pytest.raises(ValueError):
            remote.bootstrap_script("x", "h", cache_key="k", cache_paths=(path,))
    with pytest.raises(ValueError):
        remote.bootstrap_script("x", "h", cache_key="k/..", cache_paths=("/opt",))
    with pytest.raises(ValueError):
        remote.bootstrap_script("x", "h", cache_key="k", cache_paths=("/opt",), restore=(1, "nothex"))
    bundle = "reconciler/box/transfer.py"  # its bundle names it so
    assert bundle in remote.bootstrap_script("x", "h", cache_key="k", cache_paths=("/opt",))
    assert bundle not in remote.bootstrap_script("x", "h")  # no cache: the command as it always was


def test_only_a_whole_cache_answer_is_read() -> None:
    assert remote.bootstrap_cache_uploaded(f"ok cache 123 {SHA}") == (123, SHA)
    for answer in ("ok", "running", "started 12", f"ok cache -1 {SHA}", "ok cache 12 abc", f"ok cache 1 {SHA} x"):
        assert remote.bootstrap_cache_uploaded(answer) is None


@dataclass
class RecordingShell:
    calls: list[tuple[str, bytes | None]] = field(default_factory=list)

    def run(self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 0,
            max_stdout: int = 0) -> CommandResult:
        self.calls.append((command, stdin))
        return CommandResult(0, b"started 5\n", b"")


def test_the_adapter_sends_urls_on_stdin_only() -> None:
    get = "http://127.0.0.1:9/b/cache.tar?X-Amz-Signature=GETSIG"
    put = "http://127.0.0.1:9/b/cache.tar?X-Amz-Signature=PUTSIG"
    shell = RecordingShell()
    cache = BootstrapCache("k1", ("/opt/venv",), Download("c.tar", get, 10, SHA, 0.0), Upload("c.tar", put, 0.0))
    assert ShellBoxes(shell).bootstrap(box(), "echo hi", "h1", cache) == "started 5"  # type: ignore[arg-type]
    ShellBoxes(shell).bootstrap(box(), "echo hi", "h1", replace(cache, download=None))  # type: ignore[arg-type]
    (both, both_in), (put_only, put_in) = shell.calls
    assert both_in == f"{get}\n{put}\n".encode() and put_in == f"{put}\n".encode()
    assert "SIG" not in both + put_only and SHA in both and SHA not in put_only
    assert both.endswith(f" k1 10 {SHA} put /opt/venv") and put_only.endswith(" k1 '' '' put /opt/venv")


@dataclass
class FakePresigner:
    recorded: list[tuple[str, int, str]] = field(default_factory=list)
    has: Download | None = None
    ttls: list[float] = field(default_factory=list)

    def cache_upload(self, key: str, *, ttl_s: float) -> Upload:
        self.ttls.append(ttl_s)
        return Upload(f"cache/{key}.tar", "http://127.0.0.1:9/put?X-Amz-Signature=S", time.time() + ttl_s)

    def cache_download(self, key: str, *, ttl_s: float) -> Download | None:
        return self.has

    def cache_uploaded(self, key: str, upload: Upload, *, size: int, sha256: str) -> bool:
        self.recorded.append((key, size, sha256))
        return True


@dataclass
class PresigningStore:
    presigner: FakePresigner


@dataclass
class AnsweringBoxes:
    answers: list[str]
    caches: list[BootstrapCache | None] = field(default_factory=list)

    def bootstrap(self, box: Instance, script: str, script_hash: str, cache: BootstrapCache | None = None) -> str:
        self.caches.append(cache)
        return self.answers.pop(0)


def _bootstrap(store: object, boxes: AnsweringBoxes, pool: Pool = POOL) -> list[str]:
    desired = Desired(fleet=Fleet(name="f", pools=(pool,), bootstrap_timeout_s=1800.0), budget=Budget(), sweeps=(),
                      runs=())
    observed = Observed(instances=(box(),))
    ctx = ApplyContext(provider=None, boxes=boxes, desired=desired, observed=observed,  # type: ignore[arg-type]
                       archive=None, code_tar=lambda c, p: b"", now=time.time, store=store)  # type: ignore[arg-type]
    planned = Bootstrap(reason="t", code=ReasonCode.BOOTSTRAP_MISSING, instance_id=7, script_hash=pool.bootstrap_hash)
    (action,) = executable(desired, observed, [planned])  # the planner's last phase: its script and cache on it
    out = []
    for _ in range(len(boxes.answers)):
        outcome = apply(Plan(actions=(action,)), ctx).outcomes[0]
        assert outcome.ok, outcome.detail
        out.append(outcome.detail)
    return out


def test_apply_hands_a_cache_and_records_the_upload_once() -> None:
    presigner = FakePresigner()
    boxes = AnsweringBoxes(["started 5", "running", f"ok cache 99 {SHA}", "ok"])
    details = _bootstrap(PresigningStore(presigner), boxes)
    key = box_cache_key(POOL, box())
    assert details[2] == f"bootstrap ok cache 99 {SHA}; cache {key} recorded" and details[3] == "bootstrap ok"
    assert presigner.recorded == [(key, 99, SHA)]
    first = boxes.caches[0]
    assert first is not None and first.key == key and first.paths == ("/opt/venv",) and first.download is None
    assert min(presigner.ttls) > 1800.0  # the upload URL outlives the bootstrap timeout


def test_with_the_local_store_or_no_cache_paths_no_cache_is_handed(tmp_path: Path) -> None:
    boxes = AnsweringBoxes(["started 5", f"ok cache 99 {SHA}"])
    assert _bootstrap(LocalStore(tmp_path), boxes) == ["bootstrap started 5", f"bootstrap ok cache 99 {SHA}"]
    presigner = FakePresigner()
    boxes = AnsweringBoxes(["started 5"])
    _bootstrap(PresigningStore(presigner), boxes, replace(POOL, bootstrap_cache=()))
    assert boxes.caches == [None] and presigner.ttls == []
