"""Quiet loading of Hugging Face models: what every module that loads or saves one (models, the
policy artifact, the embedding model, a merged learn candidate) shares."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars (including the GGUF de-quantizing bar) for a block."""
    from functools import partial

    from transformers.utils import logging as hf_logging

    try:  # the GGUF de-quantizing bar is a plain tqdm, not governed by transformers' switch
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without GGUF support
        gguf_utils = None
    was_enabled = hf_logging.is_progress_bar_enabled()
    original_tqdm = gguf_utils.tqdm if gguf_utils else None
    hf_logging.disable_progress_bar()
    if gguf_utils:
        gguf_utils.tqdm = partial(original_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_utils:
            gguf_utils.tqdm = original_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
