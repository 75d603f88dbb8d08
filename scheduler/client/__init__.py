"""The clients: the sans-IO plans and the synchronous and asyncio clients that drive them."""
