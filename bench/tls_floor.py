"""The floor under the adapter's benchmark: aiohttp's low-level web server over asyncio's TLS, with
the adapter's TLS settings (its own ``adapter.serving.tlsutil.server_context``), answering every request with one fixed body (the adapter's own
gzip-encoded 500-pod answer) and the adapter's response headers, and doing nothing else.

Run beside the adapter in the same benchmark, it shows what HTTP/1.1 + TLS + keep-alive cost on
this machine at that moment, so the adapter's own share of its CPU per answer can be read off even
when the machine's speed changes from run to run (it does, by a factor of two, on shared hosts).

``python -m bench.tls_floor PORT CERT KEY CLIENT_CA BODY``: prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from adapter.serving.tlsutil import server_context


def main(argv: list[str]) -> int:
    port, cert, key, client_ca, body_file = argv
    ctx = server_context(
        cert_file=Path(cert), key_file=Path(key), client_ca_pems=[Path(client_ca).read_bytes()]
    )
    body = Path(body_file).read_bytes()
    headers = {
        "Content-Type": "application/json",
        "Cache-Control": "no-cache, private",
        "Vary": "Accept-Encoding",
        "Content-Encoding": "gzip",
    }

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=body, headers=headers)

    async def serve() -> None:
        server = web.Server(answer, access_log=None)
        await asyncio.get_running_loop().create_server(server, "127.0.0.1", int(port), ssl=ctx)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
