"""The SageMaker API's own constraints, read from botocore's service model (the pinned botocore in constraints.txt).

botocore's ParamValidator checks required members and types only; the model also carries enums, min/max and
patterns (Java-flavoured regular expressions such as `\\p{L}`). `constraint_errors` checks those too, so tests
take ranges and patterns from the platform's model instead of from our own constants.
"""

from __future__ import annotations

import functools

import botocore.session
import regex


@functools.cache
def sagemaker_model():
    return botocore.session.get_session().get_service_model("sagemaker")


def shape(name: str):
    return sagemaker_model().shape_for(name)


@functools.cache
def compile_pattern(pattern: str) -> regex.Pattern:
    """The model's pattern compiled by the `regex` package, which reads `\\p{...}` classes as Java does.

    A pattern it cannot compile raises: a request member we cannot check must fail the test, not pass unchecked.
    """
    try:
        return regex.compile(pattern, flags=regex.DOTALL)
    except regex.error as error:
        raise AssertionError(f"botocore pattern {pattern!r} does not compile with regex: {error}") from error


def constraint_errors(value, model_shape, path: str = "") -> list[str]:
    """Enums, min/max and patterns of the service model for `value` (a request or part of one)."""
    errors, meta = [], model_shape.metadata
    if model_shape.type_name == "structure":
        for name, member in value.items():
            errors += constraint_errors(member, model_shape.members[name], f"{path}.{name}")
    elif model_shape.type_name == "list":
        errors += _range(len(value), meta, path, "items")
        for index, item in enumerate(value):
            errors += constraint_errors(item, model_shape.member, f"{path}[{index}]")
    elif model_shape.type_name == "map":
        errors += _range(len(value), meta, path, "entries")
        for key, item in value.items():
            errors += constraint_errors(key, model_shape.key, f"{path} key")
            errors += constraint_errors(item, model_shape.value, f"{path}[{key}]")
    elif model_shape.type_name == "string":
        if model_shape.enum and value not in model_shape.enum:
            errors.append(f"{path}: {value!r} not in {model_shape.enum}")
        errors += _range(len(value), meta, path, "characters")
        if meta.get("pattern") and not compile_pattern(meta["pattern"]).fullmatch(value):
            errors.append(f"{path}: {value!r} does not match {meta['pattern']}")
    elif model_shape.type_name in ("integer", "long", "float", "double"):
        errors += _range(value, meta, path, "")
    return errors


def _range(number, meta, path, unit) -> list[str]:
    low, high = meta.get("min"), meta.get("max")
    if (low is not None and number < low) or (high is not None and number > high):
        return [f"{path}: {number} {unit} outside {low}..{high}".replace("  ", " ")]
    return []
