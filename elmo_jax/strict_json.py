"""Strict JSON (RFC 8259) for everything elmo_jax writes: Python's json writes a non-finite
float as `Infinity` or `NaN`, which strict parsers (jq, JavaScript, Go) reject. Here such a
number is written as null, and a record (a dict) names what it was under "non_finite":

    {"perplexity": null, "tokens": 43174, "non_finite": {"perplexity": "inf"}}
"""

from __future__ import annotations

import json
import math


def _finite_only(value):
    """`value` with every non-finite float, at any depth, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    """json.dumps that writes strict JSON; a dict's non-finite top-level numbers are also kept
    as text under "non_finite" (nested ones are only nulled)."""
    if isinstance(value, dict):
        named = {k: str(v) for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)}
        value = {**value, "non_finite": named} if named else value
    return json.dumps(_finite_only(value), allow_nan=False, **kwargs)
