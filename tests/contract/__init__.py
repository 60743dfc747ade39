"""Contract tests: the same scenarios over every adapter, through the real gateway."""
