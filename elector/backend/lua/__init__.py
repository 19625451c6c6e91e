"""The lease protocol's Lua scripts, as documented constants (KEYS, ARGV, replies)."""
