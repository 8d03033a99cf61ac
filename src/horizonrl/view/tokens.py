"""The token view of a trajectory: ``prompt_ids + response_ids`` decoded one token at a time, with
the loss mask and sampling logprob of each response token.

Tokenizers come from :func:`horizonrl.models.load_tokenizer` (local files only), one per model path,
loaded once; a run whose model cannot be loaded gets its token ids with a note saying why.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from horizonrl.model_config import EMBEDDED_ALIAS

#: the model a run that names none is decoded with (the embedded default), said in the note
DEFAULT_MODEL = EMBEDDED_ALIAS


class TokenizerCache:
    """One tokenizer per model path, loaded on first use; a failure is remembered as its message.

    :meth:`warm` starts a load in the background so the first trajectory page need not wait for it."""

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[PieceDecoder | None, str | None]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _load_once(self, source: str) -> tuple[PieceDecoder | None, str | None]:
        with self._guard:
            lock = self._locks.setdefault(source, threading.Lock())
        with lock:
            if source not in self._loaded:
                self._loaded[source] = _load(source)
            return self._loaded[source]

    def get(self, model: str, fallback: Path | None = None) -> tuple[PieceDecoder | None, str | None]:
        """``(decoder, None)``, or ``(None, why not)``. ``fallback`` is a directory with a saved
        tokenizer (a run's ``policy/``), tried when ``model`` cannot be loaded."""
        decoder, why_not = self._load_once(model)
        if decoder is None and fallback is not None and (fallback / "tokenizer_config.json").is_file():
            saved, _ = self._load_once(str(fallback))
            if saved is not None:
                return saved, None
        return decoder, why_not

    def warm(self, model: str, fallback: Path | None = None) -> None:
        """Load ``model``'s tokenizer on a background thread, unless it is loaded or loading."""
        with self._guard:
            if model in self._loaded or model in self._locks:
                return
            self._locks[model] = threading.Lock()
        threading.Thread(target=self.get, args=(model, fallback), daemon=True, name="view-tokenizer").start()


def _load(source: str) -> tuple[PieceDecoder | None, str | None]:
    from horizonrl.models import load_tokenizer

    try:
        return PieceDecoder(load_tokenizer(source)), None
    except Exception as exc:  # any failure: the page shows token ids and this note
        return None, f"no tokenizer for model {source!r} ({exc}); showing token ids"


class PieceDecoder:
    """``decoder(id) -> text`` of one token (None for an id outside the vocabulary), memoized."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab = len(tokenizer)
        self._pieces: dict[int, str] = {}

    def __call__(self, token_id: int) -> str | None:
        text = self._pieces.get(token_id)
        if text is None:
            if not 0 <= token_id < self.vocab:
                return None
            text = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            self._pieces[token_id] = text
        return text


def token_view(record: dict[str, Any], decode: PieceDecoder | None) -> list[dict[str, Any]]:
    """``[{id, text, mask, logprob}]`` for the prompt then the response: prompt tokens have mask 0
    and no logprob; ``text`` is None without a decoder or for an id outside its vocabulary."""
    prompt = record.get("prompt_ids") or []
    response = record.get("response_ids") or []
    mask = record.get("loss_mask") or []
    logprobs = record.get("logprobs") or []
    text = decode if decode is not None else (lambda _id: None)
    out = [{"id": t, "text": text(t), "mask": 0, "logprob": None} for t in prompt]
    for i, t in enumerate(response):
        out.append(
            {
                "id": t,
                "text": text(t),
                "mask": mask[i] if i < len(mask) else 0,
                "logprob": logprobs[i] if i < len(logprobs) else None,
            }
        )
    return out
