"""mcpipe's NATS client with an independent one, nats-py (asyncio, in a thread of its own): a nats step's
request answered by a nats-py service, and a nats-py request answered through mcpipe's client."""

from __future__ import annotations

import asyncio
import json
import threading

import nats
import trio

from kit.served import call_beside
from mcpipe.backends.nats import NatsClient


def run_service(url: str, ready: threading.Event, stop: threading.Event) -> None:
    """A nats-py service on ``stock.check``: answers {"sku", "in_stock"} (with the request's headers back)."""

    async def main() -> None:
        nc = await nats.connect(url)

        async def answer(msg: nats.aio.msg.Msg) -> None:
            sku = json.loads(msg.data)["sku"]
            await msg.respond(
                json.dumps({"sku": sku, "in_stock": sku != "none", "trace": (msg.headers or {}).get("trace")}).encode()
            )

        await nc.subscribe("stock.check", cb=answer)
        await nc.flush()
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await nc.drain()

    asyncio.run(main())


async def test_a_nats_step_is_answered_by_a_nats_py_service(nats_url: str) -> None:
    doc = {
        "pipelines": [
            {
                "name": "stock",
                "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "nats",
                        "id": "check",
                        "url": nats_url,
                        "subject": "stock.check",
                        "headers": {"trace": "t-9"},
                        "timeout_ms": 5000,
                    }
                ],
            }
        ],
    }
    with trio.fail_after(60):
        r = await call_beside(run_service, nats_url, doc, "stock", {"sku": "pen"})
    assert not r.is_error, r.content
    assert r.structured_content == {"sku": "pen", "in_stock": True, "trace": "t-9"}


async def test_a_nats_py_request_is_answered_through_mcpipes_client(nats_url: str) -> None:
    def ask() -> bytes:
        async def main() -> bytes:
            nc = await nats.connect(nats_url)
            try:
                return (await nc.request("echo.upper", b"hello", timeout=5)).data
            finally:
                await nc.close()

        return asyncio.run(main())

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            c = NatsClient(nats_url)
            await nursery.start(c.run)
            async with c.subscribe("echo.upper") as requests:

                async def serve() -> None:
                    async for msg in requests:
                        assert msg.reply is not None
                        await c.publish(msg.reply, msg.data.upper())

                nursery.start_soon(serve)
                answer = await trio.to_thread.run_sync(ask)
            nursery.cancel_scope.cancel()
    assert answer == b"HELLO"
