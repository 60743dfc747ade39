"""Open Responses gateway."""

__version__ = "0.1.0"
