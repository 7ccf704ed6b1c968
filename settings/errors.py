"""SettingsError: every bad setting is one line naming the key, the value and what is allowed."""

from __future__ import annotations

import json
from typing import Any


class SettingsError(ValueError):
    """A setting is wrong; the message is one line a user can act on."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid setting {key}={show(value)}: expected {allowed}")


def show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value) if isinstance(value, (bool, int, float, list, dict, type(None))) else repr(value)
