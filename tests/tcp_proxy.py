"""A TCP proxy in front of a real redis-server that can lose one reply: the
request reaches Redis and runs, the answer never comes back, the connection
drops.  That is what a client sees when a primary dies (or a network cuts)
right after executing its call."""

from __future__ import annotations

import asyncio
import threading

from scheduler.testing.redis_server import free_port


class ReplyDroppingProxy:
    """Forwards 127.0.0.1:<port> to Redis.  ``drop_next(marker)``: the next
    request containing ``marker`` is forwarded, its reply is read from Redis
    and thrown away, and the client's connection is closed."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._marker: bytes | None = None
        self.dropped = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    def start(self) -> ReplyDroppingProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def drop_next(self, marker: bytes) -> None:
        self._marker = marker

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self.redis_port)
        self._writers += [client_w, redis_w]
        cut = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                redis_w.write(data)
                await redis_w.drain()
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    cut.set()
            redis_w.close()

        async def downstream() -> None:
            while data := await redis_r.read(65536):
                if cut.is_set():
                    # the reply of the marked request: swallowed, connection cut
                    self.dropped += 1
                    client_w.close()
                    redis_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            for w in self._writers:
                w.close()
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def __enter__(self) -> ReplyDroppingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
