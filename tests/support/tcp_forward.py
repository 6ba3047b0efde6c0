"""A TCP forwarder: `python -m tests.support.tcp_forward LISTEN_HOST:PORT=TARGET_HOST:PORT ...`.

The multi-host test's "control" host: PostgreSQL and Redis listen on this machine's loopback
only, so the forwarder publishes them on the test bridge's address, where the other hosts
(network namespaces) reach them by address. Each accepted connection is piped both ways until
either side closes. Prints `forwarding` once every listener is bound.
"""
from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _handler(target_host: str, target_port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    return handle


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def main(rules: list[str]) -> None:
    servers = []
    for rule in rules:
        listen, target = rule.split("=")
        host, port = _split(listen)
        servers.append(await asyncio.start_server(_handler(*_split(target)), host, port,
                                                  reuse_address=True))
    print("forwarding", " ".join(rules), flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
