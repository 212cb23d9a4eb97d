"""The exit status of a benchmark's command line, shared by the benchmarks whose main() is
`run(parse_args(argv))`: a UserError (a bad flag, a missing corpus) is one `error: ...` line on
stderr and status 2, with no traceback; anything else keeps its traceback."""

import sys
from collections.abc import Callable

from zoo import errors


def exit_status(run: Callable[[], object]) -> int:
    try:
        run()
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
