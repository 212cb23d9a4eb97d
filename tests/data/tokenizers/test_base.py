import pytest
import sentencepiece as spm

from zoo.data.synthetic.documents import corpus_splits
from zoo.data.tokenizers import base as tokenizers


@pytest.fixture(scope="module")
def sentences():
    return [s for doc in corpus_splits()["train"] for s in doc.texts]


def test_trained_tokenizer_round_trips_and_fixes_special_ids(sentences, tmp_path):
    tok = tokenizers.train_sentencepiece(sentences, vocab_size=300)
    assert 100 < tok.vocab_size <= 300
    for s in sentences[:50]:
        ids = tok.encode(s)
        assert min(ids) > tokenizers.MASK_ID  # specials never produced by plain text
        assert tok.decode(ids) == s
    path = str(tmp_path / "tok.model")
    tok.save(path)
    again = tokenizers.SentencePieceTokenizer.load(path)
    assert again.encode(sentences[0]) == tok.encode(sentences[0])


def test_load_or_train_caches(sentences, tmp_path):
    path = str(tmp_path / "sub" / "tok.model")
    calls = []

    def texts():
        calls.append(1)
        return iter(sentences)

    first = tokenizers.load_or_train(path, texts, vocab_size=200)
    second = tokenizers.load_or_train(path, texts, vocab_size=200)
    assert len(calls) == 1
    assert first.encode(sentences[3]) == second.encode(sentences[3])


def test_corrupt_model_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.model"
    path.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.model"):
        tokenizers.SentencePieceTokenizer.load(str(path))
    with pytest.raises(FileNotFoundError, match="missing.model"):
        tokenizers.SentencePieceTokenizer.load(str(tmp_path / "missing.model"))


# Accents, CJK, emoji, symbols NFKC would rewrite (ﬁ, ①, full-width), every kind of whitespace;
# trained on, so most characters get pieces (☃ and 🦀 stay unknown).
NON_ASCII = [
    "Café au lait, naïve façade; the Ångström unit. Résumé über Straße İstanbul.",
    "日本語のテキストと中文字符 한국어 문장 Москва ΣΊΣΥΦΟΣ",
    "emoji 😀 🎉x 👍🏽 ﬁne ﬂow ① ＡＢＣ１２３ x² ½ € ©",
    "many   spaces\t\ttabs\n\nnewlines\r\nnbsp\u00a0ideographic\u3000line\u2028end  ",
]
UNSEEN = ["☃ snow☃man 🦀", "  leading", "", " ", "cafe\u0301 decomposed"]


@pytest.fixture(scope="module")
def bert_sp(sentences):
    return tokenizers.train_sentencepiece(sentences + NON_ASCII * 3, vocab_size=400)


def test_bert_specials_are_fixed_control_ids(bert_sp, sentences):
    tok = bert_sp
    assert isinstance(tok, tokenizers.Tokenizer)
    assert (tok.cls_id, tok.sep_id, tok.mask_id) == (4, 5, 6)
    assert [tok.id_to_token(i) for i in (4, 5, 6)] == ["[CLS]", "[SEP]", "[MASK]"]
    assert tok.token_to_id("[MASK]") == 6 and tok.token_to_id("<unk>") == tok.unk_id == 1
    assert tok.special_ids == (0, 2, 3, 4, 5, 6)
    # Plain text, even the literal names of the specials, never yields a special id.
    literal = "[CLS] a [SEP] b [MASK] <s> </s> <pad>"
    for text in sentences + NON_ASCII + UNSEEN + [literal]:
        assert not set(tok.encode(text)) & set(tok.special_ids), text
    # decode drops the specials (as it always did pad/bos/eos).
    ids = tok.encode(sentences[0])
    assert tok.decode([tok.cls_id, *ids, tok.sep_id, tok.mask_id, tok.pad_id]) == sentences[0]
    with pytest.raises(KeyError, match="nosuchpiece"):
        tok.token_to_id("nosuchpiece")
    with pytest.raises(IndexError, match="100000"):
        tok.id_to_token(100_000)


def test_offsets_are_exact_spans_of_the_original_text(bert_sp, sentences):
    tok = bert_sp
    checked = unknown = 0
    for text in sentences + NON_ASCII + UNSEEN:
        ids, offsets = tok.encode_with_offsets(text)
        assert ids == tok.encode(text)
        assert len(offsets) == len(ids)
        previous_end = 0
        for i, (start, end) in zip(ids, offsets):
            assert previous_end <= start <= end <= len(text)
            previous_end = end
            span = text[start:end]
            if i == tok.unk_id:
                assert span and not span.isspace()  # the unknown characters themselves
                unknown += 1
            else:
                # The piece, verbatim (identity normalisation), without the '▁' for its space.
                assert span == tok.id_to_token(i).lstrip("\u2581"), (text, span)
                checked += 1
        # Nothing but whitespace falls between the spans.
        covered = set()
        for start, end in offsets:
            covered.update(range(start, end))
        assert all(c.isspace() for k, c in enumerate(text) if k not in covered), text
    assert checked > 20_000 and unknown >= 4


def test_whitespace_is_mapped_to_spaces_and_nothing_else_is_normalized(bert_sp):
    tok = bert_sp
    # The table equals str.isspace over all of Unicode.
    every = {chr(c) for c in range(0x110000) if chr(c).isspace()} - {" "}
    assert set(tokenizers._WHITESPACE) == every
    assert tok.encode("a\tb\u3000c\n d") == tok.encode("a b c d")
    # No NFKC: a ligature and a circled digit are not rewritten as 'fi' / '1'.
    assert tok.decode(tok.encode("ﬁne ① ＡＢＣ")) == "ﬁne ① ＡＢＣ"
    assert tok.encode("ﬁne") != tok.encode("fine")


def test_sentencepiece_word_starts(bert_sp, sentences):
    tok = bert_sp
    for i in range(tok.vocab_size):
        expected = i in tok.special_ids or tok.id_to_token(i).startswith("\u2581")
        assert tok.is_word_start(i) == expected
    assert not tok.is_word_start(tok.unk_id)  # a lone '▁' piece starts an unknown word
    # Whole-word masking groups: exactly one start per whitespace-separated word, and the
    # group's spans cover that word.
    for text in sentences[:300] + NON_ASCII + UNSEEN:
        ids, offsets = tok.encode_with_offsets(text)
        starts = [k for k, i in enumerate(ids) if tok.is_word_start(i)]
        assert len(starts) == len(text.split()), text
        bounds = starts[1:] + [len(ids)]
        words = [text[offsets[a][0]:offsets[b - 1][1]].strip() for a, b in zip(starts, bounds)]
        assert words == text.split(), text


def test_model_without_bert_specials_says_retrain(sentences, tmp_path):
    userdef = {"user_defined_symbols": ["[CLS]", "[SEP]", "[MASK]"]}
    for name, extra in [("old", {}), ("userdef", userdef)]:
        path = tmp_path / f"{name}.model"
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences[:500]), model_prefix=str(tmp_path / name),
            vocab_size=100, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2, **extra)
        with pytest.raises(ValueError, match=f"{name}.model.*retrain"):
            tokenizers.SentencePieceTokenizer.load(str(path))


def test_load_tokenizer_picks_the_kind_from_the_file(bert_sp, tmp_path):
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

    model = str(tmp_path / "sp" / "tok.model")
    (tmp_path / "sp").mkdir()
    bert_sp.save(model)
    for path in (model, str(tmp_path / "sp")):
        loaded = tokenizers.load_tokenizer(path)
        assert isinstance(loaded, tokenizers.SentencePieceTokenizer)
        assert loaded.encode(NON_ASCII[0]) == bert_sp.encode(NON_ASCII[0])
    (tmp_path / "wp").mkdir()
    vocab = tmp_path / "wp" / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nHello\n")
    for path, lowercase, expected in [(str(vocab), True, 5), (str(vocab), False, 6),
                                      (str(tmp_path / "wp"), True, 5)]:
        loaded = tokenizers.load_tokenizer(path, lowercase=lowercase)
        assert isinstance(loaded, WordPieceTokenizer)
        assert loaded.encode("Hello") == [expected]
    with pytest.raises(FileNotFoundError, match="missing.model"):
        tokenizers.load_tokenizer(str(tmp_path / "missing.model"))
    other = tmp_path / "tok.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match=r"tok.json.*\.model.*vocab.txt"):
        tokenizers.load_tokenizer(str(other))
    with pytest.raises(ValueError, match="no vocab.txt"):
        tokenizers.load_tokenizer(str(tmp_path))
