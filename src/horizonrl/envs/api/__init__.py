"""API worlds: stateful Python APIs exposed as tool envs, with executable checkers over their state."""
