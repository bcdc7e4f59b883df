"""The gate's HTTP API served exactly like ``gate serve``, plus a trivial endpoint to compare.

Usage: python -m bench._gate_server CONFIG PORT
"""

from __future__ import annotations

import sys

from fastapi.responses import JSONResponse

from gate import GateService, load_config
from gate.serve._serve import bind, make_server


def main() -> None:
    config = load_config(sys.argv[1])
    service = GateService(config)
    service.prepare()
    server = make_server(service, "warning")
    app = server.config.app

    @app.get("/bench/trivial")
    async def trivial() -> JSONResponse:
        return JSONResponse({"ok": True})

    server.run(sockets=[bind("127.0.0.1", int(sys.argv[2]))])


if __name__ == "__main__":
    main()
