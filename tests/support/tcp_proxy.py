"""A TCP relay between a client and PostgreSQL that can cut a connection at its COMMIT:
the one moment where a client cannot know what became of its transaction.

`cut_at_commit("after")` relays the next COMMIT to the server and closes the client's side
before the answer comes back (the server commits; the client sees its connection lost).
`cut_at_commit("before")` closes both sides instead of relaying it (the server never sees
the COMMIT and rolls back). `cut_at_commit("dark")` relays the COMMIT and its answer, then
closes every connection and refuses new ones: the database goes away right after a write
committed. While `refusing`, new connections are closed at once. Everything else is
relayed byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

# psycopg ends a transaction with COMMIT as a simple query: 'Q', int32 length, text, NUL.
COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"
CHUNK = 65536


class CommitCutter:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.cut: Literal["before", "after", "dark"] | None = None
        self.cuts = 0
        self.refusing = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> CommitCutter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut_at_commit(self, when: Literal["before", "after", "dark"]) -> None:
        """Cut the next connection that sends COMMIT (once)."""
        self.cut = when

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if self.refusing:
            client_w.close()
            self._tasks.discard(task)
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        back = asyncio.create_task(self._relay(server_r, client_w))
        try:
            while data := await client_r.read(CHUNK):
                if self.cut is not None and COMMIT in data:
                    when, self.cut = self.cut, None
                    self.cuts += 1
                    if when in ("after", "dark"):
                        back.cancel()  # no answer reaches the client, unless going dark
                        await asyncio.wait([back])
                        server_w.write(data)
                        await server_w.drain()
                        if when == "dark":
                            client_w.write(await server_r.read(CHUNK))  # COMMIT's answer
                            await client_w.drain()
                            self._go_dark(task)
                        else:
                            await asyncio.sleep(0.2)  # the server commits meanwhile
                    break
                server_w.write(data)
                await server_w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            back.cancel()
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    writer.close()
            self._tasks.discard(task)

    def _go_dark(self, current: asyncio.Task[None]) -> None:
        self.refusing = True
        for task in self._tasks - {current}:
            task.cancel()

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
