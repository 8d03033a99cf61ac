"""Inference engines: token-in / token-out generation for the agent loop."""
