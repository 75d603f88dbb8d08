"""A TCP proxy that can hold what flows one way: a Redis replica that
replicates through it (``--replicaof 127.0.0.1 <proxy port>``) stays
connected, and its primary counts it, but falls behind while the proxy
holds the primary's stream (a congested link).  SIGSTOP cannot do that: the
stream waits in the stopped replica's socket buffer and is applied on
SIGCONT, so the replica is never behind."""

from __future__ import annotations

import asyncio
import threading

from scheduler.testing.redis_server import free_port


class LaggingLink:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target_port>.  ``hold()``: what
    the target sends is kept, not delivered; ``release()`` delivers it and
    goes on; ``cut()`` throws it away and closes every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._open = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> LaggingLink:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return self

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def hold(self) -> None:
        self.loop.call_soon_threadsafe(self._open.clear)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self._open.set)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers += [client_w, target_w]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, held: bool) -> None:
            try:
                while data := await r.read(65536):
                    if held:
                        await self._open.wait()
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        self._tasks += [
            asyncio.create_task(pipe(client_r, target_w, False)),
            asyncio.create_task(pipe(target_r, client_w, True)),
        ]

    def cut(self) -> None:
        async def cut() -> None:
            for w in self._writers:
                w.close()
            for t in self._tasks:
                t.cancel()
            self._writers.clear()
            self._tasks.clear()

        asyncio.run_coroutine_threadsafe(cut(), self.loop).result(5)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in self._writers:
                w.close()
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        self.loop.close()

    def __enter__(self) -> LaggingLink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
