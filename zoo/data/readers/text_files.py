"""User text files read the same way by every reader (classification, multiple choice, parallel
text): UTF-8 with an optional BOM, errors naming the file and line, lines split only at \\n."""

from zoo.errors import DataError, MissingFileError


def read_utf8(path: str, what: str) -> str:
    """The whole file as text. `what` names the file in the error a missing one gets (e.g.
    'classification data file')."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise MissingFileError(f"{what} {path} does not exist") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 byte 0x{raw[e.start]:02x}; the file must "
                        "be UTF-8 text (re-encode it, e.g. `iconv -t UTF-8`)") from None


def split_lines(text: str) -> list[str]:
    """The lines without their ends (\\n or \\r\\n); a final newline ends the last line, it does
    not start another."""
    # split("\n"), not splitlines(): the latter also breaks on \x0c, \u2028, ... inside a text.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines
