"""Tokens with a readable label for tests: the shape THORN accepts ('thn_' and 43 characters
of A-Z, a-z, 0-9, '_', '-'), so a test can name its admin and viewer tokens as constants."""

from __future__ import annotations

from thorn.auth import TOKEN_PREFIX, TOKEN_SECRET_CHARS, well_formed


def fixed_token(label: str) -> str:
    """`thn_<label>` padded with '0' to a well-formed token (`label`: at most 43 of the
    token's characters)."""
    token = TOKEN_PREFIX + label.ljust(TOKEN_SECRET_CHARS, "0")
    if not well_formed(token):
        raise ValueError(f"{label!r} cannot be a token's label (A-Z, a-z, 0-9, '_', '-'; <= 43)")
    return token
