"""The engine: validate a request, route it, assemble its context, run the turn and build its events.
It imports adapters/, state/ and the kernel, never compact/ or the app."""
