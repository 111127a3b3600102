"""Keep-alive connections during ``--shutdown-delay`` (issue 13, found by ``bench ha``).

While a terminating instance still serves (its ``/readyz`` already 503), each HTTP/1.1 response
says ``Connection: close`` and the connection closes after it, so the client's next request goes
through the load balancer to an instance that stays. Before, connections were kept open until
the delay ended and then closed while idle, racing the client's next request on them: wrk (and
any client that does not retry) saw a read error during every rolling replacement.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.gateway.hub.test_frontdoor_harness import Tls, get, read_response, running
from tests.gateway.hub.test_frontdoor_harness import tls as tls


async def test_responses_close_their_connection_once_shutdown_began(tls: Tls) -> None:
    async with running(tls, shutdown_delay=2.0) as gw:
        gw.connect_cluster("c1")
        reader, writer = await gw.open()
        try:
            writer.write(get("/c1/api/v1/pods"))
            status, headers, _ = await read_response(reader)
            assert status == 200 and headers.get("connection", "").lower() != "close"

            shutdown = asyncio.ensure_future(gw.gateway.shutdown(timeout=1.0))
            await asyncio.sleep(0.1)  # within the delay: still served
            writer.write(get("/c1/api/v1/pods"))
            status, headers, _ = await read_response(reader)
            assert status == 200
            assert headers.get("connection", "").lower() == "close"
            # ...and the gateway closes it right after, not when the delay ends.
            async with asyncio.timeout(1.0):
                assert await reader.read(1) == b""
            assert not shutdown.done(), "the delay is still running"
            # A refusal during the delay closes its connection too.
            reader2, writer2 = await gw.open()
            writer2.write(get("/c1/api/v1/pods", token=None))
            status, headers, _ = await read_response(reader2)
            assert status == 401 and headers.get("connection", "").lower() == "close"
            writer2.close()
            await shutdown
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
