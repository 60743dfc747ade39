"""Conversation state: stored responses (memory or Redis) and the WebSocket connection cache."""
