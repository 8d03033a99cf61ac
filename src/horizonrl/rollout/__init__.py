"""Rollouts: running many episodes concurrently and summarizing them."""
