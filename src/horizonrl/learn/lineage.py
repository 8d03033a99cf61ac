"""A method's iterations on one env as they are written: one :class:`Iteration` per line of
``learn/ENV/METHOD/iterations.jsonl``, and the :class:`Lineage` they make (the candidates a method
has produced, root first). A line cut by a crash is where a resumed run starts again."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class Iteration(BaseModel):
    """One finished iteration of one method on one env."""

    model_config = ConfigDict(extra="forbid")

    iteration: int
    parent: str
    child: str | None = Field(None, description="The candidate made (None: the parent was kept unchanged).")
    new: bool = Field(False, description="The child is a candidate no earlier iteration had made.")
    reason: str = Field("", description="Why no child was made (the optimizer's reply did not parse, ...).")
    optimizer_tokens: int = 0
    eval_tokens: int = 0
    wall_s: float = 0.0


class Lineage:
    """One method's iterations on one env (``iterations.jsonl``, appended as they finish)."""

    def __init__(self, folder: Path, root: str) -> None:
        self.folder = folder
        self.file = folder / "iterations.jsonl"
        self.root = root
        self.records: list[Iteration] = []
        if self.file.is_file():
            for line in self.file.read_text(encoding="utf-8").splitlines():
                try:
                    self.records.append(Iteration.model_validate_json(line))
                except ValueError:
                    break  # a line cut by a crash: that iteration runs again

    def members(self, upto: int | None = None) -> list[str]:
        """The candidates of the lineage after ``upto`` iterations (all: None), root first."""
        out = [self.root]
        for rec in self.records[:upto]:
            if rec.child is not None and rec.child not in out:
                out.append(rec.child)
        return out

    def append(self, rec: Iteration) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.file.open("a", encoding="utf-8") as f:
            f.write(rec.model_dump_json() + "\n")
        self.records.append(rec)
