"""The long-running commands (serve, agent run, demo --serve) stop on SIGINT/SIGTERM through one
helper."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from dpfl.cmdline import stop_on_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_stop_event(sig: signal.Signals) -> None:
    async def main() -> bool:
        stop = stop_on_signals()
        assert not stop.is_set()
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(stop.wait(), timeout=2)
        return stop.is_set()

    assert asyncio.run(main())
