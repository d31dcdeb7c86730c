"""The shipped tiny vision-language model (builtin:tiny-vlm) with its tokenizer and processor, loaded once."""

from __future__ import annotations

import pytest

TINY_VLM = "builtin:tiny-vlm"


@pytest.fixture(scope="session")
def vlm():
    """(model, tokenizer, processor) of builtin:tiny-vlm, through rlforge's loaders."""
    from rlforge.models import load_model, load_processor, load_tokenizer

    tok = load_tokenizer(TINY_VLM)
    return load_model(TINY_VLM), tok, load_processor(TINY_VLM, tok)
