"""Self-evolution (AgentEvolver): self-questioning — environment profiles, exploration, task
synthesis and validation by replay."""
