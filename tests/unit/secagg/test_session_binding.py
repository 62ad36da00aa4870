"""docs/secagg.md#stage-0-setup: the client recomputes session_id = SHA-256(job ‖ round ‖ nonce)
from the setup's server nonce and leaves the round when the header's id differs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dpfl.secagg import client as client_sm
from dpfl.secagg import server as server_sm
from dpfl.secagg.client_states import ClientAborted, ClientKeysAdvertised
from dpfl.secagg.config import RoundParameters
from dpfl.secagg.messages import AdvertiseKeysRequest


def _request() -> AdvertiseKeysRequest:
    params = RoundParameters(
        num_clients=3, degree=2, threshold=2, ring_bits=16, vector_length=4, min_survivors=2
    )
    _, outbound = server_sm.start_round(job_id="job", round=3, params=params)
    message = outbound[0].message
    assert isinstance(message, AdvertiseKeysRequest)
    return message


def test_honest_setup_is_accepted() -> None:
    request = _request()
    assert len(request.setup.session_nonce) == 32
    state, reply = client_sm.step(client_sm.new_client(job_id="job", round=3), request)
    assert isinstance(state, ClientKeysAdvertised)
    assert reply is not None


@pytest.mark.parametrize(
    "forge",
    [
        lambda r: replace(r, setup=replace(r.setup, session_nonce=bytes(32))),
        lambda r: replace(r, setup=replace(r.setup, session_nonce=b"")),
        lambda r: replace(r, header=replace(r.header, session_id=bytes(32))),
    ],
    ids=["other-nonce", "no-nonce", "other-session-id"],
)
def test_session_id_not_bound_to_the_nonce_is_refused(forge: object) -> None:
    request = forge(_request())  # type: ignore[operator]
    state, reply = client_sm.step(client_sm.new_client(job_id="job", round=3), request)
    assert isinstance(state, ClientAborted)
    assert reply is None
    assert "nonce" in state.reason


def test_setup_of_another_round_is_refused() -> None:
    request = _request()
    state, reply = client_sm.step(client_sm.new_client(job_id="job", round=3), request)
    assert reply is not None
    other = client_sm.new_client(job_id="job", round=4)
    forged = replace(request, header=replace(request.header, round=4))
    state, reply = client_sm.step(other, forged)
    assert isinstance(state, ClientAborted)
    assert reply is None
