"""Every store error maps to a real gRPC status code and an HTTP status (server/errors.py), as
docs/architecture.md#error-classes-and-statuses documents."""

from __future__ import annotations

import grpc
import pytest
from support.paths import ROOT

from dpfl.server import errors

TABLE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _all() -> list[type[errors.ServerError]]:
    found: list[type[errors.ServerError]] = []
    todo: list[type[errors.ServerError]] = [errors.ServerError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", _all(), ids=lambda c: c.__name__)
def test_mapping_is_valid_and_documented(cls: type[errors.ServerError]) -> None:
    assert isinstance(grpc.StatusCode[cls.grpc_status], grpc.StatusCode)
    assert 400 <= cls.http_status < 600
    row = next(line for line in TABLE.splitlines() if f"| `{cls.__name__}` " in line)
    assert f" {cls.grpc_status} " in row
    assert f" {cls.http_status} " in row


def test_hierarchy() -> None:
    assert issubclass(errors.AlreadyExists, errors.Conflict)
    assert issubclass(errors.BudgetExceeded, errors.StoreError)
    e = errors.BudgetExceeded("too much", clients=("a", "b"))
    assert e.clients == ("a", "b")
    assert errors.NotFound.http_status == 404
    assert errors.InvalidCredential.grpc_status == "UNAUTHENTICATED"
