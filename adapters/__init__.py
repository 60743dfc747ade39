"""Provider adapters: each translates a normalized UpstreamRequest into one provider's wire format
and the provider's stream back into normalized deltas (adapters/deltas.py)."""
