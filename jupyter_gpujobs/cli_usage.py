"""The CLI's one error for a wrong command line: its message is printed as one line, exit 2.
Its own module so that cli.py and the command groups it mounts (admin_cli.py) both raise it
without importing each other."""

from __future__ import annotations


class UsageError(Exception):
    """A command line the CLI cannot take; the message says what is wrong."""
