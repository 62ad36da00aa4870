"""Privacy accounting: events, RDP curves, composition, conversion to (ε, δ), tight PLD bounds,
noise calibration and the closed-form bounds of the algorithms' papers.

Pure math (numpy, scipy, dp_accounting; never torch, gRPC or SQL), so that the ledger, the
agents' policies and the ``dpfl privacy`` CLI stay light. Every ε this package reports is an
upper bound. Module layout: docs/accounting.md#package-layout.
"""

from .accountant import RdpAccountant
from .calibration import (
    CalibrationResult,
    calibrate,
    calibrate_noise_multiplier,
    sampled_gaussian_shape,
)
from .closed_form import (
    ClosedFormBound,
    fedls_noise_multiplier,
    simple_gaussian_epsilon,
    simple_gaussian_noise_multiplier,
)
from .errors import (
    AccountingError,
    CalibrationError,
    InvalidEventError,
    InvalidParameterError,
    TightPathError,
    UnsupportedEventError,
)
from .event_protocol import TightParts, event_kinds
from .events import (
    ComposedEvent,
    DataDependentVotingEvent,
    DpEvent,
    GaussianEvent,
    Level,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    distributed_gaussian,
    distributed_skellam,
    guaranteed_event,
    is_data_dependent,
    per_agent_gaussian_std,
    per_agent_skellam_mu,
)
from .orders import ORDERS
from .rdp import (
    epsilon_from_rdp,
    epsilon_from_rdp_plain,
    rdp_curve,
    supports_rdp,
)
from .report import EpsilonReport, compute_epsilon
from .serialization import EVENT_KINDS, event_from_json, event_to_json
from .tight import TightResult, gaussian_epsilon, supports_tight, tight_epsilon, tight_method

__all__ = [
    "EVENT_KINDS",
    "ORDERS",
    "AccountingError",
    "CalibrationError",
    "CalibrationResult",
    "ClosedFormBound",
    "ComposedEvent",
    "DataDependentVotingEvent",
    "DpEvent",
    "EpsilonReport",
    "GaussianEvent",
    "InvalidEventError",
    "InvalidParameterError",
    "Level",
    "NoPrivacyEvent",
    "PoissonSampledEvent",
    "RdpAccountant",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "SkellamEvent",
    "TightParts",
    "TightPathError",
    "TightResult",
    "UnsupportedEventError",
    "VotingEvent",
    "calibrate",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "distributed_gaussian",
    "distributed_skellam",
    "epsilon_from_rdp",
    "epsilon_from_rdp_plain",
    "event_from_json",
    "event_kinds",
    "event_to_json",
    "fedls_noise_multiplier",
    "gaussian_epsilon",
    "guaranteed_event",
    "is_data_dependent",
    "per_agent_gaussian_std",
    "per_agent_skellam_mu",
    "rdp_curve",
    "sampled_gaussian_shape",
    "simple_gaussian_epsilon",
    "simple_gaussian_noise_multiplier",
    "supports_rdp",
    "supports_tight",
    "tight_epsilon",
    "tight_method",
]
