"""Seeded JSON schemas of the kinds API clients send (ember's structured-output tests): objects
nesting objects and arrays with item bounds, enums and consts, anyOf, string formats and
patterns, bounded integers, required and optional properties. Every string and array is bounded
so that any model, a random one included, finishes the JSON within a short max_tokens."""
import numpy as np

WORDS = ["name", "age", "city", "tags", "score", "id", "email", "active", "items", "price", "kind",
         "created", "owner", "notes", "level", "color", "count", "when", "user", "data"]
# Formats whose llguidance pattern is bounded and as strict as jsonschema's checker ("date" takes
# "2023-02-30" and year 0000, which the checker refuses; "time" and "date-time" have unbounded
# fractions of a second, "email" an unbounded local part).
FORMATS = ["uuid", "ipv4"]


def _leaf(rng):
    k = int(rng.integers(0, 9))
    if k == 0:
        return {"type": "string", "maxLength": int(rng.integers(1, 12))}
    if k == 1:
        return {"type": "string", "minLength": 1, "maxLength": int(rng.integers(2, 10))}
    if k == 2:
        lo = int(rng.integers(-50, 50))
        return {"type": "integer", "minimum": lo, "maximum": lo + int(rng.integers(0, 1000))}
    if k == 3:
        return {"type": "boolean"}
    if k == 4:
        n = int(rng.integers(2, 5))
        return {"enum": list(rng.choice(["red", "green", "blue", "low", "high", "yes", "no"], n, replace=False))}
    if k == 5:
        return {"type": "string", "format": str(rng.choice(FORMATS))}
    if k == 6:
        return {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"}
    if k == 7:
        return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}
    return {"const": str(rng.choice(["v1", "ok", "fixed"]))}


def _value(rng, depth):
    k = int(rng.integers(0, 10)) if depth < 2 else 0
    if k <= 5:
        return _leaf(rng)
    if k == 6:
        return {"type": "array", "items": _value(rng, depth + 1), "minItems": int(rng.integers(0, 2)),
                "maxItems": int(rng.integers(2, 4))}
    if k == 7:
        return {"anyOf": [_leaf(rng), {"type": "null"}] if rng.integers(0, 2) else [_leaf(rng), _leaf(rng)]}
    return _object(rng, depth + 1)


def _object(rng, depth):
    names = list(rng.choice(WORDS, int(rng.integers(1, 5 if depth == 0 else 3)), replace=False))
    props = {str(n): _value(rng, depth) for n in names}
    # OpenAI's strict shape (no other properties); mostly every property required, some optional.
    required = list(props) if rng.random() < 0.7 else [n for n in props if rng.random() < 0.5]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schemas(n, seed=40):
    """n top-level object schemas, the same for a seed."""
    rng = np.random.default_rng(seed)
    return [_object(rng, 0) for _ in range(n)]
