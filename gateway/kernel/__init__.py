"""The kernel: errors, settings, ids, the token estimator, item normalization and the wire models.
It imports nothing above it (no engine, adapters, state, compact or app)."""
