"""The store: everything that speaks Redis, the Python half of the Lua contract."""
