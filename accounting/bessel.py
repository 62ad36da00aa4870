"""The exponentially scaled modified Bessel function of the first kind, as a log, in float64
wherever the Skellam masses ``e^{-2mu}·I_|k|(2mu)`` need it (the tight path and the Skellam
domination both read them)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

#: From this argument on, ``e^{-z}·I_k(z)`` comes from the uniform asymptotic expansion, not from
#: scipy (see :func:`log_ive`).
_BESSEL_UNIFORM_ARGUMENT = 2.0**15


def log_ive(order: Any, z: float) -> Any:
    """``log(e^{-z}·I_ν(z))`` for orders ``ν ≥ 0`` (an array) and one argument ``z > 0``.

    Why not scipy alone: scipy's ``ive`` (AMOS ``zbesi``) returns NaN from ``z = 2^30`` on
    ("no result obtained") and flags a loss of precision above 2^15. A PATE-FL job with vote
    noise σ ≥ 32 votes of 2^10 units has ``z = 2·mu ≥ 2^30``: every mass was NaN, so dropped,
    and dp_accounting composed a PLD of no finite mass (``IndexError`` in ``_truncate_tails``,
    which indexes the first element of the empty truncated array; one release alone read ε = 0
    off it).

    From ``z ≥ 2^15`` this uses Olver's uniform asymptotic expansion (DLMF 10.41.3 with
    10.41.10, terms U₁–U₃), written with ``r = √(ν² + z²)`` and ``t = ν/r`` so that it holds
    uniformly in ν ≥ 0, ν = 0 included (each ``U_k(t)/ν^k`` is a polynomial in t over ``r^k``):

        log(e^{-z}·I_ν(z)) = ν²/(r + z) − ν·asinh(ν/z) − ½·log(2π·r) + log(1 + Σ_k U_k(t)/ν^k).

    The first omitted term is ``O(r^{-4}) ≤ 1e-18`` relative here; the expansion matches mpmath
    to 1e-13 in the log, scipy (up to 2^29) to 1e-10, and its masses sum to 1 within 1e-15
    (``tests/unit/accounting/test_tight_failures.py``). Below 2^15 scipy is used as before.
    Underflow gives ``-inf`` (a zero mass), never NaN.
    """
    nu = np.asarray(order, dtype=np.float64)
    if z < _BESSEL_UNIFORM_ARGUMENT:
        with np.errstate(divide="ignore"):
            return np.log(special.ive(nu, z))
    r = np.hypot(nu, z)
    t2 = (nu / r) ** 2
    u1 = (3.0 - 5.0 * t2) / (24.0 * r)
    u2 = (81.0 + t2 * (-462.0 + 385.0 * t2)) / (1152.0 * r * r)
    u3 = (30375.0 + t2 * (-369603.0 + t2 * (765765.0 - 425425.0 * t2))) / (414720.0 * r**3)
    return (
        nu * nu / (r + z)
        - nu * np.arcsinh(nu / z)
        - 0.5 * np.log(2.0 * math.pi * r)
        + np.log1p(u1 + u2 + u3)
    )
