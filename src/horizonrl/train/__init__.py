"""Training the policy: batching, metric tracking and crash-safe checkpoints."""
