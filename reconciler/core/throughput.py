"""Throughput: each sweep's measured progress rate per GPU model and machine, and what it predicts for an offer.

DLPerf is a proxy; what a sweep *did* on a card is not. A sweep that names a ``progress`` key (``Sweep.progress``)
reports its work done in every metrics line; an archived attempt keeps the last value (``AttemptRecord.progress``).
From those, a rate is learned per sweep: progress units per second of one run, ``sum(units) / sum(seconds)`` over
the attempts with progress > 0 and a positive duration, per GPU model (the caller's normalised name) and per
machine, with the attempt count. An attempt resumed from a checkpoint (``resumed_from``) is left out: it started
with work already done, so its units are not its own. Live attempts may be given as samples too (their progress so
far over their time so far); they count in the plan, never in the committed file (``observed/throughput.yaml`` is
the archive's part only, so it changes only when the archive does).

A prediction of one sweep's rate on a GPU (``predict``), in order of preference, each saying its ``Source``:

1. ``machine``: that machine measured for the sweep;
2. ``gpu``: that GPU model measured for the sweep;
3. ``scaled``: the measured model nearest in DLPerf per GPU, scaled by the DLPerf ratio (both DLPerfs known);
4. ``dlperf``: nothing to go on; no rate. A sweep with nothing measured at all ranks offers by DLPerf per $ (as
   ``dlperf_per_dph`` does); a measured sweep ranks an offer it cannot predict last.

``work_score`` turns predictions into the ranking score of ``Ranking.WORK_PER_DPH`` (see its docstring), and
``exploration`` is the bounded, declared exception to that ranking (``Fleet.exploration_share``). Pure: no I/O,
no clock; imports only the standard library and ``reconciler.core.model``. GPU names are normalised by the caller
(``offers.normalize_gpu_name``, passed in as ``gpu_key``), so the one rule for names stays in ``offers``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from reconciler.core.model import AttemptRecord, Offer, Scalar, Sweep

__all__ = [
    "STALL_RATE_FLOOR",
    "Exploration",
    "Prediction",
    "Rate",
    "Rates",
    "Sample",
    "Source",
    "SweepRates",
    "archive_samples",
    "exploration",
    "learn",
    "predict",
    "progress_value",
    "work_per_dollar",
    "work_score",
]

# A live attempt whose average progress rate stays under this share of its learned rate for the sweep's whole
# stall_timeout is stalled (the stall rule in plan.attempts).
STALL_RATE_FLOOR = 0.10

# Progress values and durations beyond these are not believed (a box's metrics are untrusted).
MAX_PROGRESS = 1e15
MAX_SECONDS = 366 * 86400.0


class Source(enum.StrEnum):
    MACHINE = "machine"  # this machine measured for the sweep
    GPU = "gpu"  # this GPU model measured for the sweep
    SCALED = "scaled"  # the nearest measured model scaled by DLPerf per GPU
    DLPERF = "dlperf"  # nothing measured to scale from: no rate


@dataclass(frozen=True)
class Rate:
    """Progress units per second of one run, from ``attempts`` attempts (``units`` over ``seconds``)."""

    units: float
    seconds: float
    attempts: int

    @property
    def per_s(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Sample:
    """One attempt's work: ``units`` of the sweep's progress in ``seconds``, on ``gpu`` (normalised) and machine."""

    sweep: str
    gpu: str
    machine_id: int
    units: float
    seconds: float


@dataclass(frozen=True)
class SweepRates:
    gpus: Mapping[str, Rate] = field(default_factory=dict)  # normalised GPU name -> rate
    machines: Mapping[int, Rate] = field(default_factory=dict)  # machine id -> rate (0: unknown, never kept)
    machine_gpu: Mapping[int, str] = field(default_factory=dict)  # machine id -> its GPU model

    @property
    def pooled(self) -> Rate | None:
        """All of the sweep's attempts as one rate (None: nothing measured)."""
        if not self.gpus:
            return None
        units = sum(r.units for r in self.gpus.values())
        seconds = sum(r.seconds for r in self.gpus.values())
        return Rate(units, seconds, sum(r.attempts for r in self.gpus.values())) if seconds > 0 else None


@dataclass(frozen=True)
class Rates:
    sweeps: Mapping[str, SweepRates] = field(default_factory=dict)

    def of(self, sweep: str) -> SweepRates | None:
        return self.sweeps.get(sweep)

    def measured(self, sweep: str) -> bool:
        found = self.sweeps.get(sweep)
        return found is not None and bool(found.gpus)


@dataclass(frozen=True)
class Prediction:
    """A sweep's predicted progress rate on one GPU (``per_s``, None for ``Source.DLPERF``) and what it rests on."""

    per_s: float | None
    source: Source
    what: str  # the machine, model or reference model measured; for DLPERF, why there is no rate
    attempts: int = 0
    ref_dlperf: float = 0.0  # SCALED: the reference model's DLPerf per GPU, and the target's
    dlperf: float = 0.0

    @property
    def basis(self) -> str:
        """For reasons: ``machine 7: 3 attempt(s)``, ``scaled from rtx 3090 (2 attempt(s)) by DLPerf 20 -> 40``."""
        if self.source is Source.SCALED:
            return (
                f"scaled from {self.what} ({self.attempts} attempt(s)) by DLPerf {self.ref_dlperf:.3g} -> "
                f"{self.dlperf:.3g}"
            )
        if self.source is Source.DLPERF:
            return self.what
        return f"{self.what}: {self.attempts} attempt(s)"


def progress_value(sweep: Sweep, metrics: Iterable[tuple[str, Scalar]]) -> float | None:
    """The sweep's progress key's value in a metrics record (its work done), when the sweep has one and the value
    is a finite number in [0, MAX_PROGRESS]; otherwise None (a box's metrics are untrusted: total, never raises)."""
    if sweep.progress is None:
        return None
    value = dict(metrics).get(sweep.progress.key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:
        return None
    return v if math.isfinite(v) and 0.0 <= v <= MAX_PROGRESS else None


def _usable(units: float | None, seconds: float | None) -> bool:
    return (
        units is not None and seconds is not None and math.isfinite(units) and math.isfinite(seconds)
        and 0.0 < units <= MAX_PROGRESS and 0.0 < seconds <= MAX_SECONDS
    )


def archive_samples(history: Iterable[AttemptRecord], gpu_key: Callable[[str], str]) -> list[Sample]:
    """The archive's attempts that measure a rate: progress > 0, a positive duration, a GPU name, not resumed."""
    out: list[Sample] = []
    for rec in history:
        if rec.resumed_from is not None or not rec.gpu_name or rec.started_at is None or rec.ended_at is None:
            continue
        seconds = rec.ended_at - rec.started_at
        if not _usable(rec.progress, seconds):
            continue
        assert rec.progress is not None
        out.append(Sample(rec.sweep, gpu_key(rec.gpu_name), rec.machine_id, rec.progress, seconds))
    return out


def learn(samples: Iterable[Sample]) -> Rates:
    """Per sweep, per GPU model and per machine: sum of units over sum of seconds, with the attempt count."""
    gpus: dict[str, dict[str, list[float]]] = {}
    machines: dict[str, dict[int, list[float]]] = {}
    machine_gpu: dict[str, dict[int, str]] = {}
    for s in samples:
        if not s.gpu or not _usable(s.units, s.seconds):
            continue
        g = gpus.setdefault(s.sweep, {}).setdefault(s.gpu, [0.0, 0.0, 0.0])
        g[0] += s.units
        g[1] += s.seconds
        g[2] += 1
        if s.machine_id:
            m = machines.setdefault(s.sweep, {}).setdefault(s.machine_id, [0.0, 0.0, 0.0])
            m[0] += s.units
            m[1] += s.seconds
            m[2] += 1
            seen = machine_gpu.setdefault(s.sweep, {})
            seen[s.machine_id] = min(seen.get(s.machine_id, s.gpu), s.gpu)  # one model per machine; any order
    return Rates(
        {
            sweep: SweepRates(
                {k: Rate(v[0], v[1], int(v[2])) for k, v in sorted(per.items())},
                {k: Rate(v[0], v[1], int(v[2])) for k, v in sorted(machines.get(sweep, {}).items())},
                dict(sorted(machine_gpu.get(sweep, {}).items())),
            )
            for sweep, per in sorted(gpus.items())
        }
    )


def predict(
    rates: Rates, sweep: str, gpu: str, machine_id: int, dlperf: Mapping[str, float], gpu_dlperf: float | None = None
) -> Prediction:
    """The sweep's predicted rate on ``gpu`` (normalised) of ``machine_id``. ``dlperf`` is normalised GPU name ->
    DLPerf per GPU (the market's median); ``gpu_dlperf`` overrides it for the target (an offer's own figure)."""
    found = rates.of(sweep)
    if found is None or not found.gpus:
        return Prediction(None, Source.DLPERF, "nothing measured for this sweep")
    by_machine = found.machines.get(machine_id) if machine_id else None
    if by_machine is not None and by_machine.per_s > 0 and found.machine_gpu.get(machine_id, gpu) == gpu:
        return Prediction(by_machine.per_s, Source.MACHINE, f"machine {machine_id}", by_machine.attempts)
    by_gpu = found.gpus.get(gpu)
    if by_gpu is not None and by_gpu.per_s > 0:
        return Prediction(by_gpu.per_s, Source.GPU, gpu, by_gpu.attempts)
    target = gpu_dlperf if gpu_dlperf is not None and gpu_dlperf > 0 else dlperf.get(gpu)
    if target is None or not math.isfinite(target) or target <= 0:
        return Prediction(None, Source.DLPERF, f"{gpu or 'this GPU'}: unmeasured, its DLPerf unknown")
    nearest: tuple[float, str, float, Rate] | None = None
    for name, rate in found.gpus.items():
        ref = dlperf.get(name)
        if ref is None or not math.isfinite(ref) or ref <= 0 or rate.per_s <= 0:
            continue
        key = (abs(ref - target), name, ref, rate)
        if nearest is None or key[:2] < nearest[:2]:
            nearest = key
    if nearest is None:
        return Prediction(None, Source.DLPERF, f"{gpu}: unmeasured, no measured model's DLPerf on the market")
    _, name, ref, rate = nearest
    return Prediction(rate.per_s * target / ref, Source.SCALED, name, rate.attempts, ref, target)


def _slots(offer: Offer, gpus_per_run: int) -> int:
    return offer.num_gpus // max(1, gpus_per_run) if offer.num_gpus > 0 else 0


def work_per_dollar(
    offer: Offer, sweep: Sweep, rates: Rates, dlperf: Mapping[str, float], gpu_key: Callable[[str], str]
) -> tuple[float | None, Prediction]:
    """Predicted progress units per $ on ``offer`` for ``sweep`` (its slots run in parallel), and the prediction;
    None when nothing predicts a rate (``Source.DLPERF``) or the price is not positive."""
    per_gpu = offer.dlperf / offer.num_gpus if offer.num_gpus > 0 and math.isfinite(offer.dlperf) else None
    p = predict(rates, sweep.name, gpu_key(offer.gpu_name), offer.machine_id, dlperf, per_gpu)
    if p.per_s is None or not (offer.dph_total > 0 and math.isfinite(offer.dph_total)):
        return None, p
    return p.per_s * 3600.0 * _slots(offer, sweep.gpus_per_run) / offer.dph_total, p


def work_score(
    offers: Sequence[Offer],
    weights: Sequence[tuple[Sweep, float]],
    rates: Rates,
    dlperf: Mapping[str, float],
    gpu_key: Callable[[str], str],
) -> dict[int, float]:
    """Offer id -> its ``work_per_dph`` score among ``offers`` (higher is better), for a pool whose sweeps weigh
    ``weights`` (the caller gives each sweep its pending runs).

    For each sweep, an offer's predicted work per $ is divided by the best among the offers (1.0: the cheapest per
    unit of work), so sweeps with different progress units add up; the score is the weighted mean. A sweep with
    nothing measured uses DLPerf per $ in place of work per $ (so, with nothing measured at all, the order is
    ``dlperf_per_dph``'s); a measured sweep gives an offer it cannot predict 0. Weights <= 0 are ignored; with no
    positive weight, every sweep weighs 1.
    """
    given = [(s, w) for s, w in weights if w > 0] or [(s, 1.0) for s, _ in weights]
    total = sum(w for _, w in given)
    score = dict.fromkeys((o.id for o in offers), 0.0)
    if not given or total <= 0:
        for o in offers:
            score[o.id] = o.dlperf_per_dph if math.isfinite(o.dlperf_per_dph) else 0.0
        return score
    for sweep, w in given:
        raw: dict[int, float] = {}
        for o in offers:
            if rates.measured(sweep.name):
                value, _ = work_per_dollar(o, sweep, rates, dlperf, gpu_key)
            else:
                value = o.dlperf_per_dph if math.isfinite(o.dlperf_per_dph) else None
            raw[o.id] = value if value is not None and value > 0 else 0.0
        best = max(raw.values(), default=0.0)
        if best <= 0:
            continue
        for oid, v in raw.items():
            score[oid] += w / total * v / best
    return score


@dataclass(frozen=True)
class Exploration:
    """Whether renting an offer is exploration, and whether ``exploration_share`` allows it."""

    explores: bool  # its model is unmeasured for a measured sweep and predicted cheaper than the best measured option
    allowed: bool  # not exploring, or within the share
    held_unmeasured: int  # boxes held on models unmeasured for those sweeps
    limit: int  # how many such boxes the share allows once this one is rented
    detail: str


def exploration(
    offer: Offer,
    sweeps: Sequence[Sweep],
    rates: Rates,
    held: Sequence[tuple[str, int]],
    share: float,
    options: Sequence[Offer],
    dlperf: Mapping[str, float],
    gpu_key: Callable[[str], str],
) -> Exploration:
    """Whether renting ``offer`` for ``sweeps`` is exploration and whether the share allows it.

    The contract (the renting phase emits EXPLORE_UNMEASURED when ``explores and allowed``, EXPLORE_CAPPED when
    ``explores and not allowed``, and rents the best measured option instead in that case):

    * Only sweeps with some measurement count; with none, nothing is exploitable and nothing is exploration.
    * ``explores``: for one of those sweeps, ``offer``'s GPU model (``gpu_key(offer.gpu_name)``) is unmeasured,
      its predicted work per $ (``scaled``: the nearest measured model scaled by DLPerf) is above the best measured
      option's among ``options`` (the other offers the pool may rent whose model is measured). An unmeasured offer
      that predicts no cheaper work is not exploration (it is ranked lower), nor is one with no measured option to
      weigh it against (there is nothing to exploit instead), nor one with no prediction at all.
    * ``held`` are the boxes held now as (GPU name, machine id); those on a model unmeasured for the same sweeps
      count as exploring. ``limit`` is ``ceil(share * (len(held) + 1))``, at least 1 when ``share > 0`` (0 when
      ``share <= 0``: never). ``allowed`` is ``held_unmeasured < limit`` (always True when not exploring).
    """
    measured = [s for s in sweeps if rates.measured(s.name)]
    gpu = gpu_key(offer.gpu_name)
    reasons: list[str] = []
    for s in measured:
        found = rates.of(s.name)
        assert found is not None
        if gpu in found.gpus:
            continue
        value, p = work_per_dollar(offer, s, rates, dlperf, gpu_key)
        best_measured = max(
            (
                v for o in options
                if o.id != offer.id and gpu_key(o.gpu_name) in found.gpus
                and (v := work_per_dollar(o, s, rates, dlperf, gpu_key)[0]) is not None
            ),
            default=None,
        )
        if value is not None and best_measured is not None and value > best_measured:
            reasons.append(
                f"{s.name}: {gpu} unmeasured, predicted {value:.4g} units/$ ({p.basis}) > best measured option "
                f"{best_measured:.4g}"
            )
    explores = bool(reasons)
    unmeasured = sum(
        1 for g, _ in held
        if any(gpu_key(g) not in (rates.of(s.name) or SweepRates()).gpus for s in measured)
    )
    limit = 0 if share <= 0 or not math.isfinite(share) else max(1, math.ceil(share * (len(held) + 1)))
    allowed = not explores or unmeasured < limit
    detail = "; ".join(reasons) if reasons else "not exploration"
    if explores:
        detail += (
            f"; {unmeasured} box(es) held on unmeasured models, exploration_share {share:g} allows {limit} "
            f"of {len(held) + 1}"
        )
    return Exploration(explores, allowed, unmeasured, limit, detail)
