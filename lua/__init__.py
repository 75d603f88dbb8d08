"""Package marker: the Lua scripts ship inside the installed package as ``scheduler.lua``."""
