"""The Anthropic Messages ingress: wire models, the mapping to the engine's request, the encoder,
the routes."""
