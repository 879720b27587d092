"""A canned HTTP/1.1 server for checking the load generator: every request gets the same small JSON.

    python -m bench.canned PORT

It does no work per request beyond finding the end of the headers, so what the load generator
pushes through it is (a floor of) the generator's own ceiling on this machine.
"""

from __future__ import annotations

import asyncio
import sys

BODY = b'{"hello":"world"}'
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)) + BODY


class Canned(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buf += data
        count = self.buf.count(b"\r\n\r\n")  # requests without bodies (GETs): one per blank line
        if count:
            self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4:]
            self.transport.write(RESPONSE * count)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    asyncio.run(serve(int(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
