"""A client's total that holds whichever neighbouring relations its jobs used (pure arithmetic).

Summing RDP curves is valid only for one relation, and the ledger does not store each entry's
relation, so :func:`replace_one_curve` converts the whole total as if every entry were
add/remove, with RDP's weak triangle inequality (Mironov 2017, Prop. 11). The result bounds
"replace one record of this client" for any mix of relations and units, at about 4× a Gaussian's
add/remove RDP. Derivation and why converting everything is safe:
docs/accounting.md#d-adding-curves-across-jobs-neighbouring-relations.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpfl.accounting import ORDERS

__all__ = ["EXPONENTS", "replace_one_curve", "upper_envelope_index"]

Curve = npt.NDArray[np.float64]

#: The Hölder exponents p tried at every order (q = p/(p−1)); p = 2 is the classical group-2
#: bound, the others help curves that grow faster or slower than linearly.
EXPONENTS: tuple[float, ...] = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

_GRID = np.asarray(ORDERS, dtype=np.float64)


def upper_envelope_index(orders: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """For each order, the index of the smallest grid order ≥ it (``len(ORDERS)``: none)."""
    return np.searchsorted(_GRID, np.asarray(orders, dtype=np.float64), side="left")


def _at(curve: Curve, orders: npt.NDArray[np.float64]) -> Curve:
    """``curve`` (a non-decreasing bound on the grid) read at off-grid orders: the value at the
    next grid order above, +inf beyond the grid."""
    index = upper_envelope_index(orders)
    padded = np.append(curve, np.inf)
    return padded[np.minimum(index, len(curve))]


def replace_one_curve(curve: npt.ArrayLike) -> Curve:
    """An RDP curve on ``ORDERS`` for replacing one record, from a total that may mix add/remove
    and replace-one entries (module docstring).

    Args:
        curve: a client's total RDP curve on ``ORDERS`` (non-negative, +inf allowed).

    Returns:
        The converted curve, pointwise ≥ the monotone envelope of ``curve``; a curve that
        reaches zero (at the last order, hence everywhere) stays zero.

    Raises:
        ValueError: a curve of another length, or with NaN or negative values.
    """
    eps = np.asarray(curve, dtype=np.float64)
    if eps.shape != _GRID.shape:
        raise ValueError(f"a curve on ORDERS has {len(_GRID)} values, got shape {eps.shape}")
    if np.isnan(eps).any() or (eps < 0).any():
        raise ValueError("a curve must not hold NaN or negative values")
    envelope = np.minimum.accumulate(eps[::-1])[::-1]  # min over β ≥ α: still a valid bound
    if envelope[-1] == 0.0:  # D_α = 0 at some α > 1 only for equal distributions: nothing spent
        return np.zeros_like(envelope)
    best = np.full_like(envelope, np.inf)
    for p in EXPONENTS:
        q = p / (p - 1.0)
        first = (_GRID - 1.0 / p) / (_GRID - 1.0) * _at(envelope, p * _GRID)
        second = _at(envelope, q * (_GRID - 1.0 / p))
        with np.errstate(invalid="ignore"):  # 0·inf cannot occur: the coefficient is > 0
            best = np.minimum(best, first + second)
    return best
