"""Keyword arguments that were renamed: the old name keeps working, with a DeprecationWarning, until callers move."""
from __future__ import annotations

import warnings
from typing import Any


def renamed(new: str, new_value: Any, old: str, old_value: Any, where: str) -> Any:
    """The value of keyword ``new``, or of its old name ``old`` when only that was passed (with a
    DeprecationWarning pointing at the caller of ``where``). Both given with different values is a TypeError;
    ``None`` means "not passed"."""
    if old_value is None:
        return new_value
    if new_value is not None and new_value != old_value:
        raise TypeError(f"{where}: pass {new} or {old}, not both (got {new_value} and {old_value})")
    warnings.warn(f"{where}({old}=...) is deprecated: the keyword is {new}", DeprecationWarning, stacklevel=4)
    return old_value
