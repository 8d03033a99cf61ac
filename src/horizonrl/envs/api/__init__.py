"""API worlds: stateful Python APIs exposed as tool envs, with executable checkers over their state."""

from importlib import resources


def data_text(name: str) -> str:
    """A file the API worlds ship in ``envs/api/data`` (profiles, held-out tasks), as text."""
    return resources.files(__name__).joinpath("data", name).read_text(encoding="utf-8")
