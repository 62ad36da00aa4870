"""Every figure of a fixed set of events, frozen as computed before events carried their own math.

The JSON documents are what the ledger stores today (the SQL rows hold them verbatim), so they
must keep parsing to the same event and printing the same way; the RDP curves (SHA-256 of their
bytes), the reports of :func:`compute_epsilon`, the tight methods and the noise multipliers the
agent's policy reads must not move by one bit. A change of the dispatch that changes a figure
fails here, naming the event.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import NamedTuple

import pytest

from dpfl.accounting import (
    ComposedEvent,
    DataDependentVotingEvent,
    DpEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    compute_epsilon,
    event_from_json,
    event_to_json,
    guaranteed_event,
    is_data_dependent,
    rdp_curve,
    supports_rdp,
    tight_method,
)
from dpfl.accounting.errors import AccountingError
from dpfl.client.policy import PolicyError, noise_multiplier

G = GaussianEvent


class Frozen(NamedTuple):
    json: str
    guaranteed: str
    data_dependent: bool
    supports_rdp: bool
    tight_method: str | None
    curve: str
    noise_multiplier: str
    report: tuple[str, str, str, str, str, bool] | str


EVENTS: dict[str, DpEvent] = {
    "no_privacy": NoPrivacyEvent(),
    "gaussian": G(sigma=1.3, sensitivity=0.7),
    "gaussian_zero_sens": G(sigma=2.0, sensitivity=0.0),
    "gaussian_tiny_sigma": G(sigma=1e-200, sensitivity=1.0),
    "composed_gaussians": ComposedEvent((G(1.1), G(sigma=3.0, sensitivity=2.0), NoPrivacyEvent())),
    "self_composed_gaussian": SelfComposedEvent(G(4.0), 50),
    "self_composed_zero": SelfComposedEvent(G(4.0), 0),
    "poisson_gaussian": SelfComposedEvent(PoissonSampledEvent(0.01, G(1.1)), 200),
    "poisson_rate_one": PoissonSampledEvent(1.0, G(2.0)),
    "poisson_composed_gaussians": SelfComposedEvent(
        PoissonSampledEvent(0.05, ComposedEvent((G(2.0), G(3.0)))), 20
    ),
    "poisson_skellam": SelfComposedEvent(
        PoissonSampledEvent(
            0.1, SkellamEvent(mu=800.0, l1_sensitivity=30.0, l2_sensitivity=20.0, dimension=4)
        ),
        10,
    ),
    "poisson_no_privacy": PoissonSampledEvent(0.2, NoPrivacyEvent()),
    "wor_gaussian": SelfComposedEvent(
        SampledWithoutReplacementEvent(100, 10, G(sigma=2.0, sensitivity=2.0)), 30
    ),
    "wor_full": SampledWithoutReplacementEvent(10, 10, G(3.0)),
    "wor_skellam": SampledWithoutReplacementEvent(
        50, 5, SkellamEvent(mu=500.0, l1_sensitivity=40.0, l2_sensitivity=20.0, dimension=3)
    ),
    "skellam_multi": SkellamEvent(
        mu=1000.0, l1_sensitivity=40.0, l2_sensitivity=10.0, dimension=16
    ),
    "skellam_one": SelfComposedEvent(
        SkellamEvent(mu=200.0, l1_sensitivity=3.0, l2_sensitivity=3.0, dimension=1), 5
    ),
    "skellam_huge_mu": SkellamEvent(mu=1e12, l1_sensitivity=1.0, l2_sensitivity=1.0, dimension=1),
    "voting_agent": VotingEvent(queries=100, sigma=40.0, level="agent"),
    "voting_instance_k": VotingEvent(queries=50, sigma=20.0, level="instance", k=5),
    "voting_zero": VotingEvent(queries=0, sigma=20.0, level="agent"),
    "ddv": DataDependentVotingEvent(
        margins=(0.9, 0.5, 0.0, 1.0),
        num_agents=20,
        num_classes=10,
        sigma=3.0,
        s=0.5,
        level="instance",
    ),
    "ddv_empty": DataDependentVotingEvent(
        margins=(), num_agents=3, num_classes=2, sigma=1.0, s=1.0, level="agent"
    ),
    "mixed": ComposedEvent(
        (
            SelfComposedEvent(PoissonSampledEvent(0.02, G(1.5)), 30),
            VotingEvent(queries=10, sigma=30.0, level="agent"),
            G(10.0),
        )
    ),
    "mixed_ddv": ComposedEvent(
        (
            DataDependentVotingEvent(
                margins=(0.7,), num_agents=50, num_classes=3, sigma=5.0, s=1.0, level="agent"
            ),
            G(8.0),
        )
    ),
    "mixed_skellam_gaussian": ComposedEvent(
        (SkellamEvent(mu=100.0, l1_sensitivity=5.0, l2_sensitivity=5.0, dimension=2), G(2.0))
    ),
    "poisson_of_voting": PoissonSampledEvent(0.5, VotingEvent(queries=1, sigma=3.0, level="agent")),
    "wor_of_ddv": SampledWithoutReplacementEvent(
        10,
        2,
        ComposedEvent(
            (
                DataDependentVotingEvent(
                    margins=(0.5,), num_agents=2, num_classes=2, sigma=2.0, s=1.0, level="agent"
                ),
            )
        ),
    ),
}

FROZEN: dict[str, Frozen] = {
    "no_privacy": Frozen(
        json='{"kind": "no_privacy"}',
        guaranteed='{"kind": "no_privacy"}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", False),
    ),
    "gaussian": Frozen(
        json='{"kind": "gaussian", "sigma": 1.3, "sensitivity": 0.7}',
        guaranteed='{"kind": "gaussian", "sigma": 1.3, "sensitivity": 0.7}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="8474b00dae2065c6",
        noise_multiplier="1.8571428571428574",
        report=(
            "2.165297447345817",
            "analytic_gaussian",
            "9.0",
            "2.3514133031085187",
            "2.165297447345817",
            False,
        ),
    ),
    "gaussian_zero_sens": Frozen(
        json='{"kind": "gaussian", "sigma": 2.0, "sensitivity": 0.0}',
        guaranteed='{"kind": "gaussian", "sigma": 2.0, "sensitivity": 0.0}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", False),
    ),
    "gaussian_tiny_sigma": Frozen(
        json='{"kind": "gaussian", "sigma": 1e-200, "sensitivity": 1.0}',
        guaranteed='{"kind": "gaussian", "sigma": 1e-200, "sensitivity": 1.0}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="430578fc3c923164",
        noise_multiplier="1e-200",
        report=("inf", "rdp", "None", "inf", "inf", False),
    ),
    "composed_gaussians": Frozen(
        json=(
            '{"kind": "composed", "events": [{"kind": "gaussian", "sigma": 1.1, '
            '"sensitivity": 1.0}, {"kind": "gaussian", "sigma": 3.0, "sensitivity": 2.0}, '
            '{"kind": "no_privacy"}]}'
        ),
        guaranteed=(
            '{"kind": "composed", "events": [{"kind": "gaussian", "sigma": 1.1, '
            '"sensitivity": 1.0}, {"kind": "gaussian", "sigma": 3.0, "sensitivity": 2.0}, '
            '{"kind": "no_privacy"}]}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="abd3cfcf340ad47a",
        noise_multiplier="1.1",
        report=(
            "5.031755964757091",
            "analytic_gaussian",
            "5.0",
            "5.429955150410272",
            "5.031755964757091",
            False,
        ),
    ),
    "self_composed_gaussian": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "gaussian", "sigma": 4.0, '
            '"sensitivity": 1.0}, "count": 50}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "gaussian", "sigma": 4.0, '
            '"sensitivity": 1.0}, "count": 50}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="2c33a70ab29d5949",
        noise_multiplier="4.0",
        report=(
            "8.595865790470429",
            "analytic_gaussian",
            "3.6",
            "9.234958991683897",
            "8.595865790470429",
            False,
        ),
    ),
    "self_composed_zero": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "gaussian", "sigma": 4.0, '
            '"sensitivity": 1.0}, "count": 0}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "gaussian", "sigma": 4.0, '
            '"sensitivity": 1.0}, "count": 0}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", False),
    ),
    "poisson_gaussian": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.01, "event": {"kind": "gaussian", "sigma": 1.1, '
            '"sensitivity": 1.0}}, "count": 200}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.01, "event": {"kind": "gaussian", "sigma": 1.1, '
            '"sensitivity": 1.0}}, "count": 200}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="a8a0e8a463536acb",
        noise_multiplier="1.1",
        report=(
            "0.7208705112474915",
            "pld",
            "10.5",
            "1.057744508593204",
            "0.7208705112474915",
            False,
        ),
    ),
    "poisson_rate_one": Frozen(
        json=(
            '{"kind": "poisson_sampled", "sampling_rate": 1.0, "event": {"kind": "gaussian", '
            '"sigma": 2.0, "sensitivity": 1.0}}'
        ),
        guaranteed=(
            '{"kind": "poisson_sampled", "sampling_rate": 1.0, "event": {"kind": "gaussian", '
            '"sigma": 2.0, "sensitivity": 1.0}}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="c10b7447809fb87c",
        noise_multiplier="2.0",
        report=(
            "1.9930914044171086",
            "analytic_gaussian",
            "9.6",
            "2.165715659029443",
            "1.9930914044171086",
            False,
        ),
    ),
    "poisson_composed_gaussians": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.05, "event": {"kind": "composed", '
            '"events": [{"kind": "gaussian", "sigma": 2.0, "sensitivity": 1.0}, '
            '{"kind": "gaussian", "sigma": 3.0, "sensitivity": 1.0}]}}, "count": 20}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.05, "event": {"kind": "composed", '
            '"events": [{"kind": "gaussian", "sigma": 2.0, "sensitivity": 1.0}, '
            '{"kind": "gaussian", "sigma": 3.0, "sensitivity": 1.0}]}}, "count": 20}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="a9cdee17745924a4",
        noise_multiplier="2.0",
        report=(
            "0.6924849565992842",
            "pld",
            "15.0",
            "0.8358058568377034",
            "0.6924849565992842",
            False,
        ),
    ),
    "poisson_skellam": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.1, "event": {"kind": "skellam", "mu": 800.0, '
            '"l1_sensitivity": 30.0, "l2_sensitivity": 20.0, "dimension": 4}}, "count": 10}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "poisson_sampled", '
            '"sampling_rate": 0.1, "event": {"kind": "skellam", "mu": 800.0, '
            '"l1_sensitivity": 30.0, "l2_sensitivity": 20.0, "dimension": 4}}, "count": 10}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="5a387ad44bb53b00",
        noise_multiplier="2.0",
        report=(
            "0.7985981195982453",
            "pld",
            "14.0",
            "0.9359292763011304",
            "0.7985981195982453",
            False,
        ),
    ),
    "poisson_no_privacy": Frozen(
        json='{"kind": "poisson_sampled", "sampling_rate": 0.2, "event": {"kind": "no_privacy"}}',
        guaranteed=(
            '{"kind": "poisson_sampled", "sampling_rate": 0.2, "event": {"kind": "no_privacy"}}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", False),
    ),
    "wor_gaussian": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "sampled_without_replacement", '
            '"population": 100, "sample_size": 10, "event": {"kind": "gaussian", '
            '"sigma": 2.0, "sensitivity": 2.0}}, "count": 30}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "sampled_without_replacement", '
            '"population": 100, "sample_size": 10, "event": {"kind": "gaussian", '
            '"sigma": 2.0, "sensitivity": 2.0}}, "count": 30}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method=None,
        curve="b6ce673d26a4b857",
        noise_multiplier="1.0",
        report=("7.574018107320061", "rdp", "3.3", "7.574018107320061", "None", False),
    ),
    "wor_full": Frozen(
        json=(
            '{"kind": "sampled_without_replacement", "population": 10, "sample_size": 10, '
            '"event": {"kind": "gaussian", "sigma": 3.0, "sensitivity": 1.0}}'
        ),
        guaranteed=(
            '{"kind": "sampled_without_replacement", "population": 10, "sample_size": 10, '
            '"event": {"kind": "gaussian", "sigma": 3.0, "sensitivity": 1.0}}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method=None,
        curve="4c4153e70fd46c26",
        noise_multiplier="3.0",
        report=("1.3862750468052072", "rdp", "14.0", "1.3862750468052072", "None", False),
    ),
    "wor_skellam": Frozen(
        json=(
            '{"kind": "sampled_without_replacement", "population": 50, "sample_size": 5, '
            '"event": {"kind": "skellam", "mu": 500.0, "l1_sensitivity": 40.0, '
            '"l2_sensitivity": 20.0, "dimension": 3}}'
        ),
        guaranteed=(
            '{"kind": "sampled_without_replacement", "population": 50, "sample_size": 5, '
            '"event": {"kind": "skellam", "mu": 500.0, "l1_sensitivity": 40.0, '
            '"l2_sensitivity": 20.0, "dimension": 3}}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method=None,
        curve="88d8debd5785dc1a",
        noise_multiplier="1.5811388300841895",
        report=("0.9523426670381836", "rdp", "12.0", "0.9523426670381836", "None", False),
    ),
    "skellam_multi": Frozen(
        json=(
            '{"kind": "skellam", "mu": 1000.0, "l1_sensitivity": 40.0, '
            '"l2_sensitivity": 10.0, "dimension": 16}'
        ),
        guaranteed=(
            '{"kind": "skellam", "mu": 1000.0, "l1_sensitivity": 40.0, '
            '"l2_sensitivity": 10.0, "dimension": 16}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6c45568dc05bd9f",
        noise_multiplier="4.47213595499958",
        report=(
            "0.8198031507926092",
            "analytic_gaussian",
            "19.0",
            "0.8972060557188235",
            "0.8198031507926092",
            False,
        ),
    ),
    "skellam_one": Frozen(
        json=(
            '{"kind": "self_composed", "event": {"kind": "skellam", "mu": 200.0, '
            '"l1_sensitivity": 3.0, "l2_sensitivity": 3.0, "dimension": 1}, "count": 5}'
        ),
        guaranteed=(
            '{"kind": "self_composed", "event": {"kind": "skellam", "mu": 200.0, '
            '"l1_sensitivity": 3.0, "l2_sensitivity": 3.0, "dimension": 1}, "count": 5}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="12a2f95019190aab",
        noise_multiplier="6.666666666666667",
        report=(
            "1.2792194546418119",
            "pld",
            "14.0",
            "1.3980363315274296",
            "1.2792194546418119",
            False,
        ),
    ),
    "skellam_huge_mu": Frozen(
        json=(
            '{"kind": "skellam", "mu": 1000000000000.0, "l1_sensitivity": 1.0, '
            '"l2_sensitivity": 1.0, "dimension": 1}'
        ),
        guaranteed=(
            '{"kind": "skellam", "mu": 1000000000000.0, "l1_sensitivity": 1.0, '
            '"l2_sensitivity": 1.0, "dimension": 1}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="c1ed70cd2aa94dfb",
        noise_multiplier="1414213.562373095",
        report=("0.0", "rdp_fallback", "1.1", "0.0", "None", False),
    ),
    "voting_agent": Frozen(
        json='{"kind": "voting", "queries": 100, "sigma": 40.0, "level": "agent", "k": 1}',
        guaranteed='{"kind": "voting", "queries": 100, "sigma": 40.0, "level": "agent", "k": 1}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="e3ed95bffbf8bb99",
        noise_multiplier="40.0",
        report=(
            "0.9263415039991547",
            "analytic_gaussian",
            "18.0",
            "1.0125506277526435",
            "0.9263415039991547",
            False,
        ),
    ),
    "voting_instance_k": Frozen(
        json='{"kind": "voting", "queries": 50, "sigma": 20.0, "level": "instance", "k": 5}',
        guaranteed='{"kind": "voting", "queries": 50, "sigma": 20.0, "level": "instance", "k": 5}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="5714df54728f5147",
        noise_multiplier="31.622776601683796",
        report=(
            "0.8197283303981294",
            "analytic_gaussian",
            "19.0",
            "0.8969598057188237",
            "0.8197283303981294",
            False,
        ),
    ),
    "voting_zero": Frozen(
        json='{"kind": "voting", "queries": 0, "sigma": 20.0, "level": "agent", "k": 1}',
        guaranteed='{"kind": "voting", "queries": 0, "sigma": 20.0, "level": "agent", "k": 1}',
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", False),
    ),
    "ddv": Frozen(
        json=(
            '{"kind": "data_dependent_voting", "margins": [0.9, 0.5, 0.0, 1.0], '
            '"num_agents": 20, "num_classes": 10, "sigma": 3.0, "s": 0.5, '
            '"level": "instance"}'
        ),
        guaranteed='{"kind": "voting", "queries": 4, "sigma": 3.0, "level": "instance", "k": 2}',
        data_dependent=True,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="2bcf32da9d30c5d3",
        noise_multiplier="3.0",
        report=(
            "2.753381379529182",
            "analytic_gaussian",
            "7.5",
            "2.98480004524568",
            "2.753381379529182",
            True,
        ),
    ),
    "ddv_empty": Frozen(
        json=(
            '{"kind": "data_dependent_voting", "margins": [], "num_agents": 3, '
            '"num_classes": 2, "sigma": 1.0, "s": 1.0, "level": "agent"}'
        ),
        guaranteed='{"kind": "voting", "queries": 0, "sigma": 1.0, "level": "agent", "k": 1}',
        data_dependent=True,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="f6f023e482ce994c",
        noise_multiplier="inf",
        report=("0.0", "rdp", "1.1", "0.0", "0.0", True),
    ),
    "mixed": Frozen(
        json=(
            '{"kind": "composed", "events": [{"kind": "self_composed", '
            '"event": {"kind": "poisson_sampled", "sampling_rate": 0.02, '
            '"event": {"kind": "gaussian", "sigma": 1.5, "sensitivity": 1.0}}, "count": 30}, '
            '{"kind": "voting", "queries": 10, "sigma": 30.0, "level": "agent", "k": 1}, '
            '{"kind": "gaussian", "sigma": 10.0, "sensitivity": 1.0}]}'
        ),
        guaranteed=(
            '{"kind": "composed", "events": [{"kind": "self_composed", '
            '"event": {"kind": "poisson_sampled", "sampling_rate": 0.02, '
            '"event": {"kind": "gaussian", "sigma": 1.5, "sensitivity": 1.0}}, "count": 30}, '
            '{"kind": "voting", "queries": 10, "sigma": 30.0, "level": "agent", "k": 1}, '
            '{"kind": "gaussian", "sigma": 10.0, "sensitivity": 1.0}]}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="pld",
        curve="bfa8494f008a61a2",
        noise_multiplier="1.5",
        report=(
            "0.622970004090181",
            "pld",
            "17.0",
            "0.7451350643653176",
            "0.622970004090181",
            False,
        ),
    ),
    "mixed_ddv": Frozen(
        json=(
            '{"kind": "composed", "events": [{"kind": "data_dependent_voting", '
            '"margins": [0.7], "num_agents": 50, "num_classes": 3, "sigma": 5.0, "s": 1.0, '
            '"level": "agent"}, {"kind": "gaussian", "sigma": 8.0, "sensitivity": 1.0}]}'
        ),
        guaranteed=(
            '{"kind": "composed", "events": [{"kind": "voting", "queries": 1, "sigma": 5.0, '
            '"level": "agent", "k": 1}, {"kind": "gaussian", "sigma": 8.0, '
            '"sensitivity": 1.0}]}'
        ),
        data_dependent=True,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="3ce029d40310b14c",
        noise_multiplier="5.0",
        report=(
            "0.8690177481229304",
            "analytic_gaussian",
            "19.0",
            "0.9503973057188236",
            "0.8690177481229304",
            True,
        ),
    ),
    "mixed_skellam_gaussian": Frozen(
        json=(
            '{"kind": "composed", "events": [{"kind": "skellam", "mu": 100.0, '
            '"l1_sensitivity": 5.0, "l2_sensitivity": 5.0, "dimension": 2}, '
            '{"kind": "gaussian", "sigma": 2.0, "sensitivity": 1.0}]}'
        ),
        guaranteed=(
            '{"kind": "composed", "events": [{"kind": "skellam", "mu": 100.0, '
            '"l1_sensitivity": 5.0, "l2_sensitivity": 5.0, "dimension": 2}, '
            '{"kind": "gaussian", "sigma": 2.0, "sensitivity": 1.0}]}'
        ),
        data_dependent=False,
        supports_rdp=True,
        tight_method="analytic_gaussian",
        curve="e7a500e768aa34e6",
        noise_multiplier="2.0",
        report=(
            "2.5025248261505095",
            "analytic_gaussian",
            "8.0",
            "2.7166404178455332",
            "2.5025248261505095",
            False,
        ),
    ),
    "poisson_of_voting": Frozen(
        json=(
            '{"kind": "poisson_sampled", "sampling_rate": 0.5, "event": {"kind": "voting", '
            '"queries": 1, "sigma": 3.0, "level": "agent", "k": 1}}'
        ),
        guaranteed=(
            '{"kind": "poisson_sampled", "sampling_rate": 0.5, "event": {"kind": "voting", '
            '"queries": 1, "sigma": 3.0, "level": "agent", "k": 1}}'
        ),
        data_dependent=False,
        supports_rdp=False,
        tight_method=None,
        curve="UnsupportedEventError",
        noise_multiplier="3.0",
        report="UnsupportedEventError",
    ),
    "wor_of_ddv": Frozen(
        json=(
            '{"kind": "sampled_without_replacement", "population": 10, "sample_size": 2, '
            '"event": {"kind": "composed", "events": [{"kind": "data_dependent_voting", '
            '"margins": [0.5], "num_agents": 2, "num_classes": 2, "sigma": 2.0, "s": 1.0, '
            '"level": "agent"}]}}'
        ),
        guaranteed=(
            '{"kind": "sampled_without_replacement", "population": 10, "sample_size": 2, '
            '"event": {"kind": "composed", "events": [{"kind": "voting", "queries": 1, '
            '"sigma": 2.0, "level": "agent", "k": 1}]}}'
        ),
        data_dependent=True,
        supports_rdp=False,
        tight_method=None,
        curve="UnsupportedEventError",
        noise_multiplier="2.0",
        report="UnsupportedEventError",
    ),
}


def _curve_digest(event: DpEvent) -> str:
    """A digest of the RDP curve at 9 significant digits: scipy's special functions may move
    the last bits between releases, which is not a change of the figure."""
    try:
        text = ",".join(f"{v:.9g}" for v in rdp_curve(event).tolist())
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    except AccountingError as exc:
        return type(exc).__name__


def _noise_multiplier(event: DpEvent) -> str:
    try:
        return repr(noise_multiplier(event))
    except PolicyError:
        return "PolicyError"


def _report(event: DpEvent) -> tuple[str, str, str, str, str, bool] | str:
    try:
        r = compute_epsilon(event, delta=1e-5)
    except AccountingError as exc:
        return type(exc).__name__
    figures = (r.epsilon, r.method, r.order, r.rdp_epsilon, r.tight_epsilon)
    return (*(f if isinstance(f, str) else repr(f) for f in figures), r.data_dependent)  # type: ignore[return-value]


def test_the_set_covers_every_built_in_kind() -> None:
    kinds = {json.loads(f.json)["kind"] for f in FROZEN.values()}
    assert kinds == {
        "no_privacy", "gaussian", "poisson_sampled", "sampled_without_replacement",
        "self_composed", "composed", "skellam", "voting", "data_dependent_voting",
    }  # fmt: skip
    assert set(EVENTS) == set(FROZEN)


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_every_figure_is_the_frozen_one(name: str) -> None:
    event, frozen = EVENTS[name], FROZEN[name]
    computed = Frozen(
        json=json.dumps(event_to_json(event)),
        guaranteed=json.dumps(event_to_json(guaranteed_event(event))),
        data_dependent=is_data_dependent(event),
        supports_rdp=supports_rdp(event),
        tight_method=tight_method(event),
        curve=_curve_digest(event),
        noise_multiplier=_noise_multiplier(event),
        report=_report(event),
    )
    exact = {"report": "", "noise_multiplier": ""}
    assert computed._replace(**exact) == frozen._replace(**exact)
    assert _same_report(computed.report, frozen.report)
    assert _close(computed.noise_multiplier, frozen.noise_multiplier) or (
        computed.noise_multiplier == frozen.noise_multiplier
    )


def _same_report(
    computed: tuple[str, str, str, str, str, bool] | str,
    frozen: tuple[str, str, str, str, str, bool] | str,
) -> bool:
    """Equal, the RDP figures to 12 significant digits and the PLD ones to 8: scipy's
    special functions and numpy's FFT may move their last bits between releases."""
    if isinstance(computed, str) or isinstance(frozen, str):
        return computed == frozen
    eps, method, order, rdp, tight, dd = computed
    eps0, method0, order0, rdp0, tight0, dd0 = frozen
    if (method, order, dd) != (method0, order0, dd0):
        return False
    # the PLD discretises scipy's CDFs on a grid: their last bits move its figure by ~1e-9
    pld = 1e-8 if method == "pld" else 1e-12
    return (
        _close(rdp, rdp0) and _close(eps, eps0, rel_tol=pld) and _close(tight, tight0, rel_tol=pld)
    )


def _close(a: str, b: str, *, rel_tol: float = 1e-12) -> bool:
    return a == b or math.isclose(float(a), float(b), rel_tol=rel_tol)


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_a_stored_document_parses_to_the_same_event(name: str) -> None:
    stored = json.loads(FROZEN[name].json)  # a row's event column, as written before
    assert event_from_json(stored) == EVENTS[name]
    assert event_to_json(event_from_json(stored)) == stored
