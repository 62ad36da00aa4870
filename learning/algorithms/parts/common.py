"""What the algorithms share: task parameters, CSPRNG client sampling, the noise split, the choice
of the encoding's scale and the calibration record.

:func:`per_agent_noise` is the one place every algorithm takes its noise share from: the total
split over ``t·N·(1−δ)`` participants, never below what the ``t·min_survivors`` honest survivors
need, rounded up so that the agent's :func:`noise_covers` check agrees bit for bit
(docs/algorithms.md#distributed-noise-rule). Client sampling includes client i with probability
exactly the float ``q``. Every problem with a task's parameters is an :class:`AlgorithmError`
naming ``params.<key>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

from dpfl.accounting import (
    AccountingError,
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SkellamEvent,
    calibrate_noise_multiplier,
    compute_epsilon,
    event_to_json,
)
from dpfl.learning.algorithms.base import (
    AlgorithmError,
    CoordinatorData,
    PlanDetails,
    TaskParams,
)
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpec, PrivacySpec
from dpfl.mechanisms.encoding import DEFAULT_ROUNDING_BETA, EncodingConfig
from dpfl.mechanisms.noise import NoiseKind, NoiseSpec
from dpfl.secagg.errors import ParameterError
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "NOISE_KINDS",
    "Counts",
    "build_model",
    "calibrate",
    "calibrate_or_check",
    "check_noise",
    "check_sensitivities",
    "checked_aggregate",
    "choose_scale_bits",
    "claimed_total",
    "data_shape",
    "evaluate_on_test",
    "model_dimension",
    "noise_covers",
    "noise_share",
    "one_claimed_event",
    "own_fraction",
    "per_agent_noise",
    "poisson_sample",
    "ring_encoding",
    "split_noise",
    "strip_client_sampling",
]

T = TypeVar("T")

#: The job's ``privacy.noise`` values and the integer noise each adds in the ring.
NOISE_KINDS: Mapping[str, NoiseKind] = {
    "skellam": NoiseKind.SKELLAM,
    "gaussian": NoiseKind.DISCRETE_GAUSSIAN,
}
#: Rounding may inflate the L2 sensitivity of the scaled vector by at most this much.
SCALE_INFLATION = 1e-3
MAX_AUTO_SCALE_BITS = 48


# -- client sampling ---------------------------------------------------------------------------


def poisson_sample(population: Sequence[T], rate: float, stream: RandomStream) -> list[T]:
    """Each member independently with probability exactly ``rate`` (the float's exact value).

    ``rate = a/2^k`` exactly (a float); member i is in iff ``U_i < a`` for ``U_i`` uniform on
    ``[0, 2^k)`` drawn from the CSPRNG ``stream`` (64-bit words when ``k ≤ 64``, else exact big
    integers). Amplification by sampling rests on this rate and on the secrecy of the draw.

    Raises:
        AlgorithmError: a rate outside (0, 1].
    """
    if not (isinstance(rate, int | float) and 0.0 < float(rate) <= 1.0):
        raise AlgorithmError(f"sampling rate must lie in (0, 1], got {rate!r}")
    members = list(population)
    if float(rate) == 1.0 or not members:
        return members
    exact = Fraction(float(rate))
    bits = exact.denominator.bit_length() - 1  # the denominator is 2^bits
    if bits <= 64:
        words = stream.uint64(len(members))
        threshold = exact.numerator << (64 - bits)  # P[W < a·2^(64−k)] = a/2^k for 64-bit W
        keep = (words < np.uint64(threshold)).tolist()  # rate < 1: threshold < 2^64
    else:
        keep = [stream.randbelow(exact.denominator) < exact.numerator for _ in members]
    return [m for m, k in zip(members, keep, strict=True) if k]


# -- distributed noise -------------------------------------------------------------------------


def _honest(honest_fraction: float, min_survivors: int) -> float:
    if not 0.0 < honest_fraction <= 1.0:
        raise AlgorithmError(f"honest fraction must lie in (0, 1], got {honest_fraction!r}")
    if isinstance(min_survivors, bool) or not isinstance(min_survivors, int) or min_survivors < 1:
        raise AlgorithmError(f"min_survivors must be an integer >= 1, got {min_survivors!r}")
    return honest_fraction * min_survivors


def noise_covers(kind: NoiseKind, share: float, count: float, total: float) -> bool:
    """Whether ``count`` honest agents adding ``share`` each carry at least ``total`` on the sum.

    Skellam parameters add (``share·count ≥ μ_total``); discrete-Gaussian variances add
    (``share²·count ≥ σ_total²``). Evaluated in float64 exactly as written, on both sides.
    """
    if kind is NoiseKind.SKELLAM:
        return share * count >= total
    if kind is NoiseKind.DISCRETE_GAUSSIAN:
        return share * share * count >= total * total
    return False


def noise_share(kind: NoiseKind, total: float, count: float) -> float:
    """The smallest float share (up to a few ulps) that :func:`noise_covers` accepts."""
    share = total / count if kind is NoiseKind.SKELLAM else total / math.sqrt(count)
    while not noise_covers(kind, share, count, total):
        share = math.nextafter(share, math.inf)
    return share


def per_agent_noise(
    *,
    kind: NoiseKind,
    total: float,
    secure_aggregation: bool,
    honest_fraction: float,
    min_survivors: int,
    participants: int,
    dropout_fraction: float,
) -> NoiseSpec:
    """One agent's noise: its share over ``t·min(N·(1−δ), m_s)`` honest agents, or all of it.

    With ``N = participants`` and ``δ = dropout_fraction`` the share is
    ``total/(t·N·(1−δ))`` (Skellam; ``total/√(t·N·(1−δ))`` as a discrete-Gaussian std): N of
    them sum to ``total/(t·(1−δ))``, independent of N, when nobody drops out. It is never below
    ``total/(t·m_s)``, the share the guaranteed ``t·m_s`` honest survivors need (the larger one
    is taken where ``m_s < N·(1−δ)``), and it is rounded up until :func:`check_noise` accepts it
    for ``min_survivors``. See the module docstring.

    Args:
        kind: the integer noise.
        total: μ_total (Skellam) or σ_total (discrete Gaussian) the summed honest noise must reach.
        secure_aggregation: False when the agent's own noise must carry ``total`` alone (no
            secure aggregation, or a local-DP accounting); then the share is ``total`` and the
            other arguments are only validated.
        honest_fraction: t.
        min_survivors: m_s, the fewest agents any summed set has.
        participants: N, the agents that accepted the round (N ≥ m_s).
        dropout_fraction: δ in [0, 1), the job's ``secagg.dropout_fraction``.

    Raises:
        AlgorithmError: bad honest fraction, survivor or participant count, or dropout fraction,
            or a share outside the sampler's range.
    """
    guaranteed = _honest(honest_fraction, min_survivors)
    if isinstance(participants, bool) or not isinstance(participants, int):
        raise AlgorithmError(f"participants must be an integer, got {participants!r}")
    if participants < min_survivors:
        raise AlgorithmError(
            f"participants {participants} must be at least min_survivors {min_survivors}"
        )
    if (
        isinstance(dropout_fraction, bool)
        or not isinstance(dropout_fraction, int | float)
        or not 0.0 <= dropout_fraction < 1.0
    ):
        raise AlgorithmError(f"dropout fraction must lie in [0, 1), got {dropout_fraction!r}")
    if not secure_aggregation:
        share = noise_share(kind, total, 1.0)
    else:
        expected = honest_fraction * (participants * (1.0 - float(dropout_fraction)))
        share = noise_share(kind, total, min(expected, guaranteed))
        while not noise_covers(kind, share, guaranteed, total):  # float safety: never below m_s's
            share = math.nextafter(share, math.inf)
    try:
        return NoiseSpec(kind, share)
    except ValueError as exc:
        raise AlgorithmError(f"per-agent noise {share:g} is out of range: {exc}") from exc


def check_noise(
    spec: NoiseSpec,
    *,
    kind: NoiseKind,
    total: float,
    secure_aggregation: bool,
    honest_fraction: float,
    min_survivors: int,
) -> float:
    """Refuse an encoding whose per-agent noise does not carry ``total`` (agent side); return
    the fraction of ``total``'s variance the agent's own share carries (1 when it carries it
    alone): what the agent can prove of the sum's noise by itself
    (docs/accounting.md#what-the-agent-can-verify).

    Under ``secure_aggregation`` the share must cover ``total`` summed over the
    ``t·min_survivors`` honest survivors (whatever split the coordinator used, which the agent
    cannot see); with ``secure_aggregation=False`` (no masking, or a local-DP accounting) the
    agent's own share must cover it alone.

    Raises:
        AlgorithmError: naming the kind or the shortfall.
    """
    if spec.kind is not kind:
        raise AlgorithmError(
            f"the encoding adds {spec.kind.value} noise but the events need {kind.value}"
        )
    count = _honest(honest_fraction, min_survivors) if secure_aggregation else 1.0
    if not noise_covers(kind, spec.parameter, count, total):
        raise AlgorithmError(
            f"per-agent {kind.value} noise {spec.parameter:.6g} summed over {count:g} honest "
            f"agents is below the {total:.6g} the claimed events need"
        )
    return own_fraction(kind, spec.parameter, total)


def own_fraction(kind: NoiseKind, share: float, total: float) -> float:
    """The fraction of ``total``'s variance one agent's ``share`` carries, at most 1 (Skellam
    parameters are variances up to a factor 2; a discrete Gaussian's parameter is its std),
    rounded down so that it never overstates the share."""
    if total <= 0.0 or noise_covers(kind, share, 1.0, total):
        return 1.0
    ratio = share / total if kind is NoiseKind.SKELLAM else (share / total) ** 2
    return max(math.nextafter(ratio, 0.0), math.ulp(0.0))


def check_encoding(
    encoding: EncodingConfig,
    task: TaskParams,
    *,
    total: float,
    honest_fraction: float,
    min_survivors: int,
    num_clients: int,
) -> float:
    """The agent's last checks of a setup: the per-agent noise carries ``total``, the summed
    noise ``task``'s claim was computed with (:func:`check_noise`), and the sum of
    ``num_clients`` encoded vectors cannot wrap the ring. Returns :func:`check_noise`'s own
    fraction.

    Raises:
        AlgorithmError: naming the shortfall.
    """
    fraction = check_noise(
        encoding.noise,
        kind=NOISE_KINDS[task.noise],
        total=total,
        secure_aggregation=task.secure_aggregation,
        honest_fraction=honest_fraction,
        min_survivors=min_survivors,
    )
    try:
        encoding.check_no_wrap(num_clients)
    except ParameterError as exc:
        raise AlgorithmError(f"the ring would wrap: {exc}") from exc
    return fraction


def split_noise(
    details: PlanDetails,
    *,
    dropout_fraction: float,
    participants: int,
    min_survivors: int,
    secure_aggregation: bool | None = None,
) -> NoiseSpec:
    """:func:`per_agent_noise` of a plan (its noise, total, masking and t); ``secure_aggregation``
    overrides the plan's flag (DP-FedSGD's local accounting adds the whole noise per agent)."""
    return per_agent_noise(
        kind=NOISE_KINDS[details.noise],
        total=details.noise_total,
        secure_aggregation=(
            details.secure_aggregation if secure_aggregation is None else secure_aggregation
        ),
        honest_fraction=details.honest_fraction,
        min_survivors=min_survivors,
        participants=participants,
        dropout_fraction=dropout_fraction,
    )


def ring_encoding(
    *, clip: float, scale_bits: int, participants: int, noise: NoiseSpec
) -> EncodingConfig:
    """The smallest ring holding the sum of ``participants`` encoded vectors with ``noise``.

    Raises:
        AlgorithmError: no ring of at most 64 bits holds it.
    """
    try:
        return EncodingConfig.for_summands(
            clip=clip, scale_bits=scale_bits, summands=participants, noise=noise
        )
    except ParameterError as exc:
        raise AlgorithmError(f"no ring holds this round's sum: {exc}") from exc


def claimed_total(
    release: DpEvent,
    *,
    noise: str,
    l1: float,
    l2: float,
    dimension: int,
    source: str,
) -> float:
    """The summed noise a claimed release was computed with (μ, or σ for Gaussian noise), after
    checking that it is the task's kind over ``dimension`` coordinates with the sensitivities
    the agent recomputed from ``source`` (:func:`check_sensitivities`).

    Raises:
        AlgorithmError: another kind of release, dimension or sensitivity.
    """
    if noise == "skellam":
        if not isinstance(release, SkellamEvent):
            raise AlgorithmError(f"Skellam noise but a {type(release).__name__} is claimed")
        if release.dimension != dimension:
            raise AlgorithmError(
                f"the event has dimension {release.dimension}, the task {dimension}"
            )
        check_sensitivities(
            {"L1": (release.l1_sensitivity, l1), "L2": (release.l2_sensitivity, l2)},
            source=source,
        )
        return release.mu
    if not isinstance(release, GaussianEvent):
        raise AlgorithmError(f"Gaussian noise but a {type(release).__name__} is claimed")
    check_sensitivities({"L2": (release.sensitivity, l2)}, source=source)
    return release.sigma


def checked_aggregate(
    aggregate: npt.NDArray[np.float64], *, length: int, survivors: int
) -> npt.NDArray[np.float64]:
    """The decoded sum as float64, refused when it is not ``length`` finite values or nobody
    contributed.

    Raises:
        AlgorithmError: naming the problem.
    """
    total = np.asarray(aggregate, dtype=np.float64)
    if total.shape != (length,):
        raise AlgorithmError(f"aggregate of shape {total.shape}, expected ({length},)")
    if not np.isfinite(total).all() or survivors < 1:
        raise AlgorithmError("aggregate contains NaN or infinity, or nobody contributed")
    return total


def one_claimed_event(
    events: Sequence[DpEvent],
    *,
    algorithm: str,
    task_honest_fraction: float,
    honest_fraction: float,
    num_clients: int,
    min_survivors: int,
) -> DpEvent:
    """The agent-side checks every single-event algorithm makes first: the setup's honest
    fraction is the task's, ``1 ≤ min_survivors ≤ num_clients``, exactly one event is claimed.

    Raises:
        AlgorithmError: naming the mismatch.
    """
    if honest_fraction != task_honest_fraction:
        raise AlgorithmError(
            f"honest fraction {honest_fraction:g} differs from the task's {task_honest_fraction:g}"
        )
    if not 1 <= min_survivors <= num_clients:
        raise AlgorithmError(f"min_survivors {min_survivors} outside [1, {num_clients}]")
    if len(events) != 1:
        raise AlgorithmError(f"a {algorithm} round charges one event, {len(events)} claimed")
    return events[0]


def check_sensitivities(pairs: Mapping[str, tuple[float, float]], *, source: str) -> None:
    """Refuse claimed sensitivities (``name: (claimed, recomputed)``) that are not the ones the
    agent recomputed from ``source`` (relative tolerance 1e-12: both sides evaluate the same
    float formulas).

    Raises:
        AlgorithmError: naming every mismatch with both values.
    """
    wrong = [
        f"the event's {name} sensitivity {claimed:.10g} differs from the {actual:.10g} of {source}"
        for name, (claimed, actual) in pairs.items()
        if not math.isclose(claimed, actual, rel_tol=1e-12)
    ]
    if wrong:
        raise AlgorithmError("; ".join(wrong))


def choose_scale_bits(
    *,
    clip: float,
    dimension: int,
    inflation: float = SCALE_INFLATION,
    rounding_beta: float = DEFAULT_ROUNDING_BETA,
) -> int:
    """The smallest b whose rounding inflates the L2 sensitivity by at most ``inflation``.

    Conditional stochastic rounding bounds the rounded vector's norm by
    ``Δ₂ = √(c² + d/4 + √(2 ln 1/β)·(c + √d/2))`` with ``c = S·2^b`` (Kairouz, Liu & Steinke 2021,
    Thm. 1), unconditional rounding (β = 0) by ``c + √d``; we take the smallest b with
    ``Δ₂ ≤ (1 + inflation)·c``. Then the noise calibrated on
    Δ₂ is within ``inflation`` of what the unrounded vector needs, and the per-coordinate rounding
    variance (≤ 1/4 per agent) is negligible next to the summed noise variance (≥ z²c², and
    ``d/4 ≤ 2·inflation·c²``). The ring must still hold the sum: see the callers, which lower b
    when the population's sum would not fit 64 bits.
    """
    for bits in range(MAX_AUTO_SCALE_BITS + 1):
        if math.ldexp(clip, bits) >= 2.0**61:
            break
        config = EncodingConfig(
            clip=clip, scale_bits=bits, ring_bits=64, rounding_beta=rounding_beta
        )
        if config.rounded_l2_bound(dimension) <= (1.0 + inflation) * config.scaled_clip:
            return bits
    raise AlgorithmError(
        f"no scale below 2^{MAX_AUTO_SCALE_BITS} keeps the rounding of {dimension} coordinates "
        f"with clip {clip:g} within {inflation:.1%}"
    )


class Counts(TypedDict):
    """What a setup says of its participants (``AgentSide.check``'s keywords); every agent's
    check reads it."""

    num_clients: int
    min_survivors: int
    honest_fraction: float


# -- calibration -------------------------------------------------------------------------------


def calibrate_or_check(
    make_event: Callable[[float], DpEvent],
    *,
    given: float | None,
    target_epsilon: float | None,
    delta: float,
) -> tuple[float, dict[str, Any]]:
    """The noise multiplier for the whole job: ``given``, or calibrated for ``target_epsilon``.

    A given multiplier must meet the target when both are set. The record lists the job's whole
    event, its ε (min of RDP and the tight path where one exists) and how the multiplier was
    chosen.

    Raises:
        AlgorithmError: the target cannot be met, or the given noise misses it.
    """
    try:
        if given is not None:
            z = float(given)
            report = compute_epsilon(make_event(z), delta=delta, tight=True)
            if target_epsilon is not None and report.epsilon > target_epsilon:
                raise AlgorithmError(
                    f"the given noise {z:g} reaches ε = {report.epsilon:.4g} at δ = {delta:g}, "
                    f"above the target ε = {target_epsilon:g}"
                )
            mode = "given"
        elif target_epsilon is not None:
            z, report = calibrate_noise_multiplier(
                make_event, target_epsilon=target_epsilon, delta=delta, tight=True
            )
            mode = "calibrated"
        else:
            raise AlgorithmError("neither a noise level nor a target ε is set")
        event = make_event(z)
    except AccountingError as exc:
        raise AlgorithmError(f"noise calibration failed: {exc}") from exc
    record = {
        "mode": mode,
        "target_epsilon": target_epsilon,
        "delta": delta,
        "epsilon": report.epsilon,
        "method": report.method,
        "order": report.order,
        "rdp_epsilon": report.rdp_epsilon,
        "tight_epsilon": report.tight_epsilon,
        "event": event_to_json(event),
    }
    return z, record


def calibrate(
    make_event: Callable[[float], DpEvent], privacy: PrivacySpec
) -> tuple[float, dict[str, object]]:
    """:func:`calibrate_or_check` with the job's own noise multiplier, target ε and δ."""
    return calibrate_or_check(
        make_event,
        given=privacy.noise_multiplier,
        target_epsilon=privacy.target_epsilon,
        delta=privacy.delta,
    )


def strip_client_sampling(event: DpEvent) -> DpEvent:
    """``event`` without its outer Poisson client-sampling wrapper (see ``agent_charge``)."""
    return event.event if isinstance(event, PoissonSampledEvent) else event


# -- data and model sizes ----------------------------------------------------------------------


def data_shape(job: JobSpec, data: CoordinatorData | None) -> tuple[tuple[int, ...], int]:
    """``(input_shape, num_classes)`` from ``data``, else from the job's data set spec.

    Raises:
        AlgorithmError: the data set cannot be loaded.
    """
    if data is not None:
        return tuple(int(s) for s in data.input_shape), int(data.num_classes)
    from dpfl.learning.data import load_dataset

    try:
        dataset = load_dataset(job.data.dataset)
    except LearningError as exc:
        raise AlgorithmError(
            f"cannot size the model without the coordinator's data: {exc}"
        ) from exc
    return dataset.input_shape, dataset.num_classes


def model_dimension(spec: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    """d, the number of parameters of model ``spec`` on this data.

    Raises:
        AlgorithmError: the model does not fit the data.
    """
    from dpfl.learning.params import model_signature

    net = build_model(spec, input_shape, num_classes, seed=0)
    return model_signature(net).num_parameters


def build_model(spec: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int) -> Any:
    """``dpfl.learning.models.build_model`` with its errors as :class:`AlgorithmError`."""
    from dpfl.learning.models import build_model as build

    try:
        return build(spec, input_shape=input_shape, num_classes=num_classes, seed=seed)
    except LearningError as exc:
        raise AlgorithmError(f"model {spec!r}: {exc}") from exc


def evaluate_on_test(net: Any, data: CoordinatorData) -> dict[str, float]:
    """``{"accuracy", "loss"}`` on the coordinator's test split, or ``{}`` without one."""
    if data.test_x is None or data.test_y is None or len(data.test_y) == 0:
        return {}
    from dpfl.learning.training import evaluate

    result = evaluate(net, data.test_x, data.test_y)
    return {"accuracy": result.accuracy, "loss": result.loss}
