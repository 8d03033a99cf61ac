"""Experience streams (`horizon stream`): a continual run with no fixed step count.

Tasks arrive from a source, the policy acts, the reward is a weighted sum of grounded signals the env
reports, the policy is updated as experience accrues, and a bi-level loop moves the reward weights
toward what a small feedback signal (thumbs up/down over HTTP, a held-out preference set) prefers.
See docs/streams.md.
"""
