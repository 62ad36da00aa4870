"""The coordinator's gRPC server refuses a port another process holds, and says which.

gRPC sets SO_REUSEPORT by default, so a second coordinator on the same port used to start
without a word and split the agents between two ledgers."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest

from dpfl.server.errors import ConfigurationError
from dpfl.server.grpc.server import start_grpc_server
from dpfl.server.grpc.servicer import AgentServicer


class _NoMethods:
    """The one servicer method the binding calls."""

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("dpfl.test.Nothing", {})


async def _start(port: int) -> tuple[Any, int]:
    servicer = cast(AgentServicer, _NoMethods())
    return await start_grpc_server(servicer, host="127.0.0.1", port=port, max_message_bytes=1 << 20)


def test_a_second_server_on_a_held_port_is_refused_by_name() -> None:
    async def main() -> None:
        first, port = await _start(0)
        try:
            with pytest.raises(ConfigurationError, match=rf"--grpc-port {port}.*another process"):
                await _start(port)
        finally:
            await first.stop(None)
        # once the first has gone, the port is free again
        again, bound = await _start(port)
        assert bound == port
        await again.stop(None)

    asyncio.run(main())
