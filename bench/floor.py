#!/usr/bin/env python3
"""The floor: swamp's dispatch hop written with nothing else, to measure swamp against.

Client → server → worker process → back, over trio-websocket, with the two SQLite writes a
durable dispatch cannot do without (a row inserted when the work is handed out, updated when
it ends; WAL, ``synchronous=NORMAL``, as swamp's store). The server hands each request to the
connected worker with the most free slots and waits, without polling, when none is free. No
authentication, no validation, no events, no queue records: what is left is the cost of the
stack (Python, trio, websockets, SQLite) for this shape of work, on this machine, now.

``serve-hypercorn`` is the same server behind Hypercorn (swamp's HTTP server) instead of a bare
trio-websocket listener: the difference is what one port for HTTP and websockets costs the hop
(``python3 build.py bench --floors``).

Run as processes by ``bench/dispatch.py`` (``python3 build.py bench``):

    python3 bench/floor.py serve DB        # prints {"url": ...} once listening
    python3 bench/floor.py serve-hypercorn DB
    python3 bench/floor.py worker URL SLOTS
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from contextlib import asynccontextmanager

import trio
from trio_websocket import ConnectionClosed, open_websocket_url, serve_websocket


class Worker:
    def __init__(self, ws, slots: int) -> None:
        self.ws = ws
        self.free = slots


class Floor:
    def __init__(self, db_path: str) -> None:
        self.db = sqlite3.connect(db_path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS dispatch (id INTEGER PRIMARY KEY, worker INTEGER, "
            "state TEXT, started REAL, ended REAL)"
        )
        self.workers: list[Worker] = []
        self.freed = trio.Event()
        self.waiting: dict[int, list] = {}  # dispatch id -> [event, reply]
        self.next_id = 0

    async def handle(self, request) -> None:
        ws = await request.accept()
        hello = json.loads(await ws.get_message())
        if hello["role"] == "worker":
            await self.serve_worker(ws, hello["slots"])
        else:
            await self.serve_client(ws)

    async def serve_worker(self, ws, slots: int) -> None:
        worker = Worker(ws, slots)
        self.workers.append(worker)
        self.freed.set()
        try:
            while True:
                reply = json.loads(await ws.get_message())
                waiter = self.waiting.pop(reply["id"])
                waiter[1] = reply
                waiter[0].set()
        except ConnectionClosed:
            self.workers.remove(worker)

    async def serve_client(self, ws) -> None:
        try:
            while True:
                request = json.loads(await ws.get_message())
                reply = await self.dispatch(request)
                await ws.send_message(json.dumps({"id": request["id"], "result": reply}))
        except ConnectionClosed:
            pass

    async def dispatch(self, request: dict) -> dict:
        while True:
            worker = max(self.workers, key=lambda w: w.free, default=None)
            if worker is not None and worker.free > 0:
                break
            self.freed = trio.Event()
            await self.freed.wait()
        worker.free -= 1
        self.next_id += 1
        dispatch_id = self.next_id
        self.db.execute(
            "INSERT INTO dispatch VALUES (?, ?, 'active', ?, NULL)",
            (dispatch_id, id(worker), time.time()),
        )
        waiter = [trio.Event(), None]
        self.waiting[dispatch_id] = waiter
        await worker.ws.send_message(
            json.dumps({"id": dispatch_id, "method": request["method"], "args": request["args"]})
        )
        await waiter[0].wait()
        self.db.execute(
            "UPDATE dispatch SET state='done', ended=? WHERE id=?", (time.time(), dispatch_id)
        )
        worker.free += 1
        self.freed.set()
        return waiter[1]["result"]


async def serve(db_path: str) -> None:
    floor = Floor(db_path)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, floor.handle, "127.0.0.1", 0, None)
        port = server.port
        print(json.dumps({"url": f"ws://127.0.0.1:{port}/"}), flush=True)


class AsgiSocket:
    """An accepted ASGI websocket with trio-websocket's two calls, for the same server code."""

    def __init__(self, receive, send) -> None:
        self.receive, self.send = receive, send

    async def get_message(self) -> str:
        message = await self.receive()
        if message["type"] != "websocket.receive":
            raise ConnectionClosed(None)
        return message.get("text") or message.get("bytes", b"").decode()

    async def send_message(self, text: str) -> None:
        await self.send({"type": "websocket.send", "text": text})


async def serve_hypercorn(db_path: str) -> None:
    import hypercorn.config
    import hypercorn.trio

    floor = Floor(db_path)

    class Accepted:
        def __init__(self, receive, send) -> None:
            self.receive, self.send = receive, send

        async def accept(self) -> AsgiSocket:
            await self.receive()  # websocket.connect
            await self.send({"type": "websocket.accept"})
            return AsgiSocket(self.receive, self.send)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "websocket":
            await floor.handle(Accepted(receive, send))
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return

    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None

    class Status:
        @staticmethod
        def started(binds) -> None:
            address = binds[0].split("://", 1)[1]
            print(json.dumps({"url": f"ws://{address}/"}), flush=True)

    await hypercorn.trio.serve(app, config, task_status=Status())


async def work(url: str, slots: int) -> None:
    """A no-op method, answered at once (a no-op needs no task of its own)."""
    async with open_websocket_url(url) as ws:
        await ws.send_message(json.dumps({"role": "worker", "slots": slots}))
        print(json.dumps({"event": "enrolled"}), flush=True)
        try:
            while True:
                request = json.loads(await ws.get_message())
                await ws.send_message(json.dumps({"id": request["id"], "result": {}}))
        except ConnectionClosed:
            pass


@asynccontextmanager
async def client(url: str):
    """The bench's side: an async ``call()`` that makes one dispatch and returns its result."""
    async with open_websocket_url(url) as ws:
        await ws.send_message(json.dumps({"role": "client"}))
        counter = 0

        async def call() -> dict:
            nonlocal counter
            counter += 1
            await ws.send_message(json.dumps({"id": counter, "method": "echo", "args": {}}))
            return json.loads(await ws.get_message())

        yield call


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        trio.run(serve, sys.argv[2])
    elif sys.argv[1:2] == ["serve-hypercorn"]:
        trio.run(serve_hypercorn, sys.argv[2])
    elif sys.argv[1:2] == ["worker"]:
        trio.run(work, sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
