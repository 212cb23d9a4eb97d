"""The Bible in Spanish and English, verse-aligned, from Debian's `sword-text-sparv` (Reina-Valera
1909, SWORD module spaRV1909eb, KJV versification) and `sword-text-web` (World English Bible
with Deuterocanon, engWEB2015eb, NRSVA versification), read with zoo.data.corpora.sword.

The two versifications agree verse for verse on the 66 books of the KJV canon except that the
NRSVA numbers one more verse in 3 John 1 and Revelation 12 (both empty in the WEB, which keeps
the KJV's numbering there); its deuterocanon books (after Malachi) have no Spanish side and are
left out (counted). Verse (book, chapter, verse) of one is paired with the same of the other.

Writes into DIR/bible:
* train.tsv, validation.tsv, test.tsv: `source<TAB>target` lines without a header (what
  zoo.data.readers.parallel reads), Spanish source, English target, one verse per line, in
  canonical order; a verse empty on either side (a translation that merged it into a
  neighbour) is skipped and counted.
* train.txt, validation.txt, test.txt: the English verses as BERT pretraining text, one
  document per book, one verse per line.
Split by book: VALIDATION_BOOKS validate, TEST_BOOKS test, every other book trains.
"""

from __future__ import annotations

import collections
import re

from zoo.data.corpora import fetching, kjv, sword, writing
from zoo.errors import DataError

DESCRIPTION = ("The Bible, verse-aligned: Reina-Valera 1909 (Spanish) and the World English "
               "Bible; public domain")
PACKAGES = (fetching.Package("apt", "sword-text-sparv", "2.60-1",
                             "sword-text-sparv_2.60-1_all.deb"),
            fetching.Package("apt", "sword-text-web", "426.0-1", "sword-text-web_426.0-1_all.deb"))
VALIDATION_BOOKS = ("Josh", "Ruth", "Phil", "Jas")
TEST_BOOKS = ("Judg", "Jonah", "Eph", "1Pet")
SPLIT_RULE = (f"by book: validation = {', '.join(VALIDATION_BOOKS)}; test = "
              f"{', '.join(TEST_BOOKS)}; every other book of the 66 trains")
_CONF = re.compile(r"^(\./)?usr/share/sword/mods\.d/[^/]+\.conf$")
_DATA = re.compile(r"^(\./)?usr/share/sword/(modules/texts/ztext/[^/]+/)(ot|nt)\.(bzs|bzv|bzz)$")
_NAMES = {book: name for testament in sword.TESTAMENTS.values() for book, name, _ in testament}


def split_of_book(book: str) -> str:
    return ("validation" if book in VALIDATION_BOOKS else "test" if book in TEST_BOOKS
            else "train")


def _module(path: str) -> tuple[dict, dict[str, dict[str, bytes]]]:
    """The conf and {testament: {ext: bytes}} of the one zText module in a Debian package."""
    confs, data = [], collections.defaultdict(dict)
    for member, raw in fetching.deb_members(path, lambda n: bool(_CONF.match(n) or
                                                                 _DATA.match(n))):
        if _CONF.match(member):
            confs.append(sword.read_conf(raw.decode("utf-8", errors="replace")))
        else:
            found = _DATA.match(member)
            data[found.group(3)][found.group(4)] = raw
    if len(confs) != 1 or sorted(data) != ["nt", "ot"] or any(len(v) != 3 for v in data.values()):
        raise DataError(f"{path}: expected one SWORD module (mods.d/*.conf and ot/nt .bzs .bzv "
                        f".bzz); found {len(confs)} conf files and {dict(data)!r:.120}")
    return confs[0], data


def _verses(path: str, counts: writing.Counts) -> tuple[dict, dict]:
    """(conf, {(book, chapter, verse): text}) of one package; empty verses included."""
    conf, data = _module(path)
    verses = {}
    for testament, files in data.items():
        where = f"{path}: {conf.get('id', '?')} {testament}"
        index_keys = sword.keys(conf.get("Versification", "KJV"), testament, where)
        raw = sword.entries(files["bzs"], files["bzv"], files["bzz"], where)
        if len(raw) != len(index_keys):
            raise DataError(f"{where}: {len(raw)} index entries; {conf.get('Versification')} "
                            f"versification has {len(index_keys)}")
        markup = [writing.without_controls(writing.decode(entry, counts), counts)
                  for entry in raw]
        sword.check_chapters(index_keys, markup, where)
        for key, text in zip(index_keys, markup):
            if key is sword.DEUTEROCANON:
                if text.strip():
                    counts.skipped[f"{conf['id']}: deuterocanon index entries with text "
                                   "(no Spanish side)"] += 1
            elif key and key[2]:
                verses[key], cut = sword.verse_text(text)
                if cut:
                    counts.handled[f"{conf['id']}: text after the end of a book (glossary) "
                                   "cut from its last verse"] += 1
    return conf, verses


def convert(packages: dict[str, str], out: str, counts: writing.Counts, report) -> dict:
    modules = [_verses(path, counts) for path in packages.values()]
    by_lang = {conf.get("Lang"): (conf, verses) for conf, verses in modules}
    if sorted(by_lang) != ["en", "es"]:
        raise DataError(f"{', '.join(packages.values())}: expected an English and a Spanish "
                        f"module; their confs say Lang={sorted(map(str, by_lang))}")
    (es_conf, spanish), (en_conf, english) = by_lang["es"], by_lang["en"]
    order = [key for key in sword.keys("NRSVA", "ot", "") + sword.keys("NRSVA", "nt", "")
             if key and key is not sword.DEUTEROCANON and key[2]]
    pairs = {split: [] for split in writing.SPLITS}
    text = {split: collections.OrderedDict() for split in writing.SPLITS}
    for key in order:
        es, en = spanish.get(key, ""), english.get(key, "")
        split = split_of_book(key[0])
        if en:
            text[split].setdefault(key[0], []).append(en)
        if es and en:
            pairs[split].append((es, en))
        elif key not in spanish:
            counts.skipped["verses numbered only in the English (NRSVA) versification"] += 1
        else:
            side = ("Spanish and English sides" if not (es or en) else
                    "Spanish side" if not es else "English side")
            counts.skipped[f"verse pairs with the {side} empty"] += 1
    report(f"bible: {sum(map(len, pairs.values())):,} verse pairs")
    splits = {}
    for split in writing.SPLITS:
        books = list(text[split].values())
        splits[split] = [
            writing.write_tsv(out, f"{split}.tsv", pairs[split], documents=len(text[split])),
            writing.write_text(out, f"{split}.txt", books)]
    return {
        "licence": (f"Reina-Valera 1909: {es_conf.get('DistributionLicense', '?')}; World English "
                    f"Bible: {en_conf.get('DistributionLicense', '?')} (the modules' confs; "
                    "\"World English Bible\" is a trademark of eBible.org)"),
        "split_rule": SPLIT_RULE,
        "splits": splits,
        "notes": {
            "languages": {"source": "es (Reina-Valera 1909)", "target": "en (World English "
                                                                      "Bible)"},
            "books": {split: [_NAMES[b] for b in text[split]]
                      for split in ("validation", "test")},
            "versification": f"Spanish {es_conf.get('Versification')}, English "
                             f"{en_conf.get('Versification')} (its deuterocanon and the verses "
                             "3 John 1:15 and Revelation 12:18 have no Spanish side); "
                             f"{len(kjv.OLD_TESTAMENT) + len(kjv.NEW_TESTAMENT)} books paired",
            "text": "OSIS notes and section titles dropped, canonical titles (psalm "
                    "superscriptions) kept, tags removed, entities unescaped, whitespace runs "
                    "as one space"},
    }
