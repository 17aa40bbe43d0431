"""The one exception type for problems the user can fix in what they passed to the data layer."""

from __future__ import annotations


class DataError(ValueError):
    """A user-caused data problem (unknown task, missing or malformed files); the message says the fix."""
