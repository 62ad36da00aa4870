"""Naming enum values that arrive from the network.

A peer built from a newer protocol (or a hostile one) may send numbers this side does not know;
text about its message (logs, errors, the agent's events) must name them, not raise."""

from __future__ import annotations

from google.protobuf.descriptor import EnumDescriptor

__all__ = ["enum_name"]


def enum_name(enum: EnumDescriptor, value: int) -> str:
    """The name of an enum value, or ``"<value> (unknown <enum>)"``."""
    known = enum.values_by_number.get(value)
    return known.name if known is not None else f"{value} (unknown {enum.name})"
