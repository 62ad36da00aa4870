"""``dpfl privacy``: ε of a mechanism, and noise calibration (thin; calls dpfl.accounting).

Exit codes: 0 success; 2 bad arguments or a malformed event (``InvalidEventError``,
``InvalidParameterError``); 3 an event no accounting path supports (``UnsupportedEventError``);
4 calibration could not reach the target (``CalibrationError``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from dpfl.accounting import (
    AccountingError,
    CalibrationError,
    DpEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    UnsupportedEventError,
    VotingEvent,
    calibrate,
    compute_epsilon,
    event_from_json,
)
from dpfl.cmdline import Subparsers

#: mechanism -> (required flags, optional flags); every other mechanism flag is refused.
MECHANISMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gaussian": (("noise_multiplier",), ("steps",)),
    "poisson-gaussian": (("sampling_rate", "noise_multiplier"), ("steps",)),
    "uniform-gaussian": (("population", "sample_size", "noise_multiplier"), ("steps",)),
    "pate": (("queries", "sigma", "level"), ()),
    "knn": (("queries", "sigma", "k", "level"), ()),
    "skellam": (
        ("mu", "l1_sensitivity", "l2_sensitivity", "dimension"),
        ("steps", "sampling_rate"),
    ),
    "event": (("event",), ()),
}
_MECHANISM_FLAGS = sorted({f for req, opt in MECHANISMS.values() for f in (*req, *opt)})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def register(subparsers: Subparsers) -> None:
    """Add ``privacy epsilon`` and ``privacy calibrate``."""
    privacy = subparsers.add_parser(
        "privacy", help="privacy accounting: ε of a mechanism, noise calibration"
    )
    sub = privacy.add_subparsers(dest="privacy_command", metavar="ACTION")
    privacy.set_defaults(func=lambda args: _missing_action(privacy))

    eps = sub.add_parser(
        "epsilon",
        help="ε at δ of a mechanism (min of RDP and the tight bound)",
        description="The ε at δ of a mechanism: RDP with the improved conversion, and the exact "
        "Gaussian or PLD bound where one applies; the smallest is reported with its method.",
    )
    eps.add_argument("--mechanism", required=True, choices=sorted(MECHANISMS))
    eps.add_argument("--noise-multiplier", type=float, help="noise std / clip norm (Z)")
    eps.add_argument("--steps", type=int, help="number of compositions T (default 1)")
    eps.add_argument("--sampling-rate", type=float, help="Poisson sampling rate q")
    eps.add_argument("--population", type=int, help="population size N (uniform-gaussian)")
    eps.add_argument("--sample-size", type=int, help="sample size M (uniform-gaussian)")
    eps.add_argument("--queries", type=int, help="number of voting queries Q")
    eps.add_argument("--sigma", type=float, help="noise std on the summed votes")
    eps.add_argument("--k", type=int, help="neighbours per agent vote (knn)")
    eps.add_argument("--level", choices=("agent", "instance"), help="protected unit (voting)")
    eps.add_argument("--mu", type=float, help="Skellam parameter per coordinate (variance 2·mu)")
    eps.add_argument("--l1-sensitivity", type=float, help="Skellam L1 sensitivity (integers)")
    eps.add_argument("--l2-sensitivity", type=float, help="Skellam L2 sensitivity (integers)")
    eps.add_argument("--dimension", type=int, help="Skellam dimension")
    eps.add_argument("--event", help="an event in its JSON form (mechanism 'event')")
    eps.add_argument("--delta", type=float, required=True)
    eps.add_argument("--rdp-only", action="store_true", help="skip the tight path")
    eps.add_argument("--json", action="store_true", help="print one JSON object")
    eps.set_defaults(func=_epsilon)

    cal = sub.add_parser(
        "calibrate",
        help="smallest noise multiplier of T Poisson-subsampled Gaussian steps meeting (ε, δ)",
    )
    cal.add_argument("--target-epsilon", type=float, required=True)
    cal.add_argument("--delta", type=float, required=True)
    cal.add_argument("--sampling-rate", type=float, default=1.0)
    cal.add_argument("--steps", type=int, default=1)
    cal.add_argument("--rdp-only", action="store_true", help="calibrate on RDP alone")
    cal.add_argument("--json", action="store_true", help="print one JSON object")
    cal.set_defaults(func=_calibrate)


def _missing_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


class _UsageError(Exception):
    pass


def _build_event(args: argparse.Namespace) -> DpEvent:
    required, optional = MECHANISMS[args.mechanism]
    missing = [_flag(f) for f in required if getattr(args, f) is None]
    if missing:
        raise _UsageError(f"--mechanism {args.mechanism} needs {', '.join(missing)}")
    extra = [
        _flag(f)
        for f in _MECHANISM_FLAGS
        if f not in required and f not in optional and getattr(args, f) is not None
    ]
    if extra:
        raise _UsageError(f"--mechanism {args.mechanism} does not take {', '.join(extra)}")
    steps = 1 if args.steps is None else args.steps
    if steps < 1:
        raise _UsageError("--steps must be ≥ 1")

    def repeat(step: DpEvent) -> DpEvent:
        return step if steps == 1 else SelfComposedEvent(step, steps)

    m = args.mechanism
    if m == "gaussian":
        return repeat(GaussianEvent.from_multiplier(args.noise_multiplier))
    if m == "poisson-gaussian":
        return repeat(
            PoissonSampledEvent(
                args.sampling_rate, GaussianEvent.from_multiplier(args.noise_multiplier)
            )
        )
    if m == "uniform-gaussian":
        # Replace-one: swapping a record moves the clipped sum by up to 2·C, so the Gaussian of
        # std Z·C has replace-one sensitivity 2·C (in units of C: sigma=Z, sensitivity=2).
        inner = GaussianEvent(sigma=args.noise_multiplier, sensitivity=2.0)
        return repeat(SampledWithoutReplacementEvent(args.population, args.sample_size, inner))
    if m == "pate":
        return VotingEvent(queries=args.queries, sigma=args.sigma, level=args.level, k=1)
    if m == "knn":
        return VotingEvent(queries=args.queries, sigma=args.sigma, level=args.level, k=args.k)
    if m == "skellam":
        step: DpEvent = SkellamEvent(
            mu=args.mu,
            l1_sensitivity=args.l1_sensitivity,
            l2_sensitivity=args.l2_sensitivity,
            dimension=args.dimension,
        )
        if args.sampling_rate is not None:
            step = PoissonSampledEvent(args.sampling_rate, step)
        return repeat(step)
    try:
        document = json.loads(args.event)
    except json.JSONDecodeError as exc:
        raise _UsageError(f"--event is not valid JSON: {exc}") from None
    return event_from_json(document)


def _run(action: Callable[[], int]) -> int:
    try:
        return action()
    except _UsageError as exc:
        print(f"dpfl privacy: error: {exc}", file=sys.stderr)
        return 2
    except UnsupportedEventError as exc:
        print(f"dpfl privacy: unsupported: {exc}", file=sys.stderr)
        return 3
    except CalibrationError as exc:
        print(f"dpfl privacy: calibration failed: {exc}", file=sys.stderr)
        return 4
    except AccountingError as exc:
        print(f"dpfl privacy: error: {exc}", file=sys.stderr)
        return 2


def _table(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _fmt(x: object) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def _epsilon(args: argparse.Namespace) -> int:
    def action() -> int:
        event = _build_event(args)
        report = compute_epsilon(event, delta=args.delta, tight=not args.rdp_only)
        if args.json:
            print(json.dumps(report.to_json()))
            return 0
        rows = [(key, _fmt(value)) for key, value in report.to_json().items()]
        if report.data_dependent:
            rows.append(("note", "data-dependent: not a worst-case guarantee"))
        _table(f"dpfl privacy epsilon ({args.mechanism})", rows)
        return 0

    return _run(action)


def _calibrate(args: argparse.Namespace) -> int:
    def action() -> int:
        if args.steps < 1:
            raise _UsageError("--steps must be ≥ 1")
        result = calibrate(
            target_epsilon=args.target_epsilon,
            delta=args.delta,
            sampling_rate=args.sampling_rate,
            steps=args.steps,
            tight=not args.rdp_only,
        )
        document = result.to_json()
        if args.json:
            print(json.dumps(document))
            return 0
        rows = [
            ("noise_multiplier", _fmt(result.noise_multiplier)),
            ("epsilon", _fmt(result.epsilon)),
            ("method", result.method),
        ]
        for name, bound in document["closed_form"].items():
            rows.append(
                (
                    f"closed form: {name}",
                    f"z = {_fmt(bound['noise_multiplier'])} (accountant ε there: "
                    f"{_fmt(bound['accountant_epsilon'])})",
                )
            )
        _table("dpfl privacy calibrate", rows)
        return 0

    return _run(action)
