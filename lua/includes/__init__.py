"""Package marker for the shared Lua includes."""
