"""Old spellings that still work: one line on stderr the first time each is used.

A renamed config value or module path keeps the command lines and imports users already have
working; the notice says what to write instead, once per process, so a loop reading the
config every step does not flood the log.
"""

import sys

_noticed: set[str] = set()


def notice(message: str) -> None:
    """Prints `zoo: deprecated: <message>` to stderr, the first time this message is given."""
    if message in _noticed:
        return
    _noticed.add(message)
    print(f"zoo: deprecated: {message}", file=sys.stderr)
