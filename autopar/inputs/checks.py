"""The checks every frozen spec's ``__post_init__`` runs on one field: each raises
``InputError`` naming the field and the rule."""

from __future__ import annotations

from autopar.base.errors import InputError, excerpt


def positive(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"must be a positive integer, got {excerpt(value)}", field=name)
    if value < 1:
        raise InputError(f"must be a positive integer, got {value}", field=name)


def non_negative(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"must be a non-negative integer, got {excerpt(value)}", field=name)


def positive_number(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InputError(f"must be a positive number, got {excerpt(value)}", field=name)
