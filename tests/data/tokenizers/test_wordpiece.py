import random
import unicodedata

import numpy as np
import pytest

from zoo.data.synthetic.documents import corpus_splits
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Seen while training the test vocabulary, so these characters get pieces.
TRAIN_EXTRA = [
    "Café au lait, naïve façade; the Ångström unit. Résumé, coöperate, élan, über, Straße.",
    "İstanbul ΣΊΣΥΦΟΣ Москва Zürich São Paulo. Ωmega ÆØÅ æøå",
    "日本語のテキストと中文字符 한국어 문장 العربية हिन्दी",
    "don't stop! U.S.A. costs $3.50 (approx.) — 50% off; e-mail: a+b=c <html> ~user C++ #tag",
    "😀 🎉 ✓ € © ° ½",
]
# Punctuation, accents (composed and decomposed), case, CJK, emoji, words with unseen
# characters, control and format characters, every kind of whitespace, over-long words.
TRICKY = TRAIN_EXTRA + [
    "CAFÉ Café café cafe\u0301 CAFE\u0301",
    "naïve NAÏVE nai\u0308ve Ångström ÅNGSTRÖM \u212bngstr\u00f6m",
    "HeLLo WoRLD, MiXeD CaSe! iPhone McDonald's",
    "日本語 中文 漢字かな交じり 한국어 豈 𠀋 x\U0002B830x",
    "unassigned a\u0378b c\uffffd private\ue000use",
    "emoji 😀😀 🎉x x🎉 👍🏽 👨\u200d👩\u200d👧 🦀 ☃ unknown☃word ☃",
    "control\x00char\x07s and \x1b[31mansi\x1b[0m del\x7f \ufffdreplacement",
    "soft\u00adhyphen zero\u200bwidth",
    "many   spaces\t\ttabs\n\nnewlines\r\nwindows \u00a0nbsp\u3000ideographic",
    "\u2028line\x0bvt\x0cff\x85nel\u2029para",
    "   leading and trailing   ",
    "",
    " \t\n ",
    "a" * 150 + " ok " + "Ab" * 60,
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "[CLS] literal [MASK] and [SEP] and [PAD] [UNK]",
    "ﬁne ﬂow ① ＡＢＣ１２３ x² ½",
    "Ǆemal ǅ ǆ ẞ ß İ ı ΐ Σ ς σ",
    "«quotes» “curly” ‘single’ — – … ¿Qué? ¡Hola! 「括弧」",
    "‘Don’t’ isn't it's we're I'm they've he'd",
    "hindi हिन्दी arabic العربية thai ภาษาไทย",
    "x" * 8 + " " + "y" * 9 + " abc.def,ghi;jkl",
]
CONFIGS = [
    {"lowercase": True},
    {"lowercase": False},
    {"lowercase": True, "strip_accents": False},
    {"lowercase": False, "strip_accents": True},
    {"lowercase": True, "tokenize_chinese_chars": False},
    {"lowercase": True, "max_input_chars_per_word": 8},
]


@pytest.fixture(scope="module")
def sentences():
    return [s for doc in corpus_splits()["train"] for s in doc.texts]


@pytest.fixture(scope="module")
def trained_vocab(sentences, tmp_path_factory):
    """vocab.txt trained by HF `tokenizers` on the corpus (cased and lowercased) + extras."""
    hf = pytest.importorskip("tokenizers")
    trainer = hf.BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    texts = sentences + [s.lower() for s in sentences] + TRAIN_EXTRA * 5
    trainer.train_from_iterator(texts, vocab_size=700, min_frequency=2, show_progress=False)
    directory = tmp_path_factory.mktemp("wordpiece")
    trainer.save_model(str(directory))
    return str(directory / "vocab.txt")


def hf_reference(vocab_path, lowercase=True, strip_accents=None, tokenize_chinese_chars=True,
                 max_input_chars_per_word=100):
    """HF's BERT pipeline (the parts of BertWordPieceTokenizer), without added special tokens."""
    hf = pytest.importorskip("tokenizers")
    tok = hf.Tokenizer(hf.models.WordPiece.from_file(
        vocab_path, unk_token="[UNK]", max_input_chars_per_word=max_input_chars_per_word))
    tok.normalizer = hf.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = hf.pre_tokenizers.BertPreTokenizer()
    tok.decoder = hf.decoders.WordPiece(prefix="##", cleanup=True)
    return tok


def write_vocab(path, tokens):
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_ids_offsets_and_decode_match_hf(config, trained_vocab, sentences):
    ref = hf_reference(trained_vocab, **config)
    tok = WordPieceTokenizer.from_vocab_file(trained_vocab, **config)
    texts = sentences + TRICKY + [t.upper() for t in TRICKY] + [" ".join(TRICKY)]
    num_unk = 0
    for text in texts:
        expected = ref.encode(text, add_special_tokens=False)
        ids, offsets = tok.encode_with_offsets(text)
        assert ids == expected.ids, (text, tok.tokenize(text), expected.tokens)
        assert offsets == [tuple(o) for o in expected.offsets], text
        assert tok.encode(text) == ids
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False), text
        num_unk += ids.count(tok.unk_id)
    assert num_unk > 5  # the unseen characters and long words did reach the [UNK] path


def test_matches_bert_wordpiece_tokenizer_class(trained_vocab, sentences):
    hf = pytest.importorskip("tokenizers")
    ref = hf.BertWordPieceTokenizer(trained_vocab, lowercase=True)
    tok = WordPieceTokenizer.from_vocab_file(trained_vocab, lowercase=True)
    # That class also matches literal special tokens in the text; zoo never does (tested below).
    for text in sentences[:300] + [t for t in TRICKY if "[" not in t]:
        expected = ref.encode(text, add_special_tokens=False)
        assert tok.encode_with_offsets(text) == (
            expected.ids, [tuple(o) for o in expected.offsets]), text


@pytest.mark.parametrize("lowercase", [True, False])
def test_random_text_matches_hf(lowercase, trained_vocab):
    """encode caches space-separated chunks and walks ASCII chunks by regex instead of character
    by character; random strings of every ASCII character (controls that vanish and join their
    neighbours, ones that separate, punctuation) among letters and some non-ASCII ones must
    still give HF's ids and offsets."""
    ref = hf_reference(trained_vocab, lowercase=lowercase)
    tok = WordPieceTokenizer.from_vocab_file(trained_vocab, lowercase=lowercase)
    rng = random.Random(0)
    alphabet = ([chr(c) for c in range(128)] + list("éÉßİ日😀\u00a0\u2028\u200b")
                + list("etaoinsrhl   ") * 10)
    for _ in range(3000):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        expected = ref.encode(text, add_special_tokens=False)
        ids, offsets = tok.encode_with_offsets(text)
        assert (ids, offsets) == (expected.ids, [tuple(o) for o in expected.offsets]), repr(text)
        assert tok.encode(text) == ids, repr(text)


def test_encode_flat_is_encode_batch_end_to_end(trained_vocab, sentences):
    tok = WordPieceTokenizer.from_vocab_file(trained_vocab)
    texts = sentences[:300] + TRICKY + ["", "   "]
    ids, lengths = tok.encode_flat(texts)
    want = tok.encode_batch(texts)
    assert ids.dtype == np.int32 and lengths.tolist() == [len(w) for w in want]
    assert ids.tolist() == [i for w in want for i in w]


def test_greedy_longest_match_first(tmp_path):
    vocab = SPECIALS + ["un", "##want", "##wan", "##ted", "##ed", "want", "runn", "##ing", ",",
                        "un##", "a", "##a", "##aa", "##aaa"]
    path = write_vocab(tmp_path / "vocab.txt", vocab)
    tok = WordPieceTokenizer.from_vocab_file(path)
    # BERT README's example: longest prefix first, then the longest continuation at each step.
    assert tok.tokenize("UNwanted,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    # A word with no split into vocabulary pieces is one [UNK] over the whole word.
    assert tok.encode_with_offsets("want unwantedx") == (
        [tok.token_to_id("want"), tok.unk_id], [(0, 4), (5, 14)])
    # 6 characters split greedily; 7 exceed max_input_chars_per_word.
    short = WordPieceTokenizer.from_vocab_file(path, max_input_chars_per_word=6)
    assert short.tokenize("aaaaaa aaaaaaa") == ["a", "##aaa", "##aa", "[UNK]"]
    assert tok.tokenize("aaaaaaa") == ["a", "##aaa", "##aaa"]


def uncased_form(span):
    return "".join(c for c in unicodedata.normalize("NFD", span)
                   if unicodedata.category(c) != "Mn").lower()


@pytest.mark.parametrize("lowercase", [True, False])
def test_offsets_point_into_the_original_text(lowercase, sentences, tmp_path):
    """Every known piece is its source span, normalized; needs no HF (vocab built here)."""
    words = {w for s in sentences + TRICKY for w in s.split()}
    normed = {uncased_form(w) if lowercase else w for w in words}
    chars = sorted({c for w in normed for c in w} - {"☃", "🦀"})
    vocab = SPECIALS + sorted(normed) + chars + ["##" + c for c in chars]
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path / "vocab.txt", vocab),
                                             lowercase=lowercase)
    checked = 0
    for text in sentences[:500] + TRICKY:
        ids, offsets = tok.encode_with_offsets(text)
        assert len(ids) == len(offsets)
        for i, (start, end) in zip(ids, offsets):
            span = text[start:end]
            assert 0 <= start < end <= len(text) and not any(c.isspace() for c in span)
            if i != tok.unk_id:
                piece = tok.id_to_token(i).removeprefix("##")
                # Characters the cleaner drops (\u200d, \u00ad, ...) stay inside no span.
                assert (uncased_form(span) if lowercase else span) == piece, (text, span, piece)
                checked += 1
        starts = [s for s, _ in offsets]
        assert starts == sorted(starts)
    assert checked > 3000
    # Accents are stripped from the pieces, but the offsets still cover the accented source.
    text = "Ångström CAFÉ"
    ids, offsets = tok.encode_with_offsets(text)
    assert [text[s:e] for s, e in offsets] == ["Ångström", "CAFÉ"]


def test_specials_word_starts_and_decode(tmp_path):
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + [
        "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", "mask", "cls", "play", "##ing", "##s", "."]
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path / "vocab.txt", vocab))
    assert isinstance(tok, tokenizers.Tokenizer)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 4, 5, 6, 7)
    assert tok.special_ids == (0, 5, 6, 7)
    assert tok.vocab_size == len(vocab)
    # Literal special tokens in the text are text, as in BERT's own tokenizer.
    assert tok.tokenize("[MASK] [CLS] playing") == [
        "[", "mask", "]", "[", "cls", "]", "play", "##ing"]
    ids = tok.encode("plays playing.")
    assert [tok.is_word_start(i) for i in ids] == [True, False, True, False, True]
    assert all(tok.is_word_start(i) for i in tok.special_ids + (tok.unk_id,))
    assert tok.decode([tok.cls_id, *ids, tok.sep_id, tok.pad_id]) == "plays playing."
    assert tok.decode([tok.unk_id, tok.mask_id, tok.token_to_id("play")]) == "[UNK] play"
    assert tok.token_to_id("##s") == 14 and tok.id_to_token(14) == "##s"
    with pytest.raises(KeyError, match="zzz"):
        tok.token_to_id("zzz")
    with pytest.raises(IndexError, match="99"):
        tok.id_to_token(99)


def test_bad_vocab_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        WordPieceTokenizer.from_vocab_file(str(tmp_path / "nothere.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        WordPieceTokenizer.from_vocab_file(str(empty))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("\n".join(SPECIALS + ["café"]).encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8"):
        WordPieceTokenizer.from_vocab_file(str(latin1))
    no_mask = write_vocab(tmp_path / "nomask.txt", SPECIALS[:4] + ["a"])
    with pytest.raises(ValueError, match=r"nomask.txt lacks the special token\(s\) \[MASK\]"):
        WordPieceTokenizer.from_vocab_file(no_mask)
    good = write_vocab(tmp_path / "vocab.txt", SPECIALS + ["a"])
    with pytest.raises(ValueError, match="max_input_chars_per_word"):
        WordPieceTokenizer.from_vocab_file(good, max_input_chars_per_word=0)
    # Windows line endings are accepted: the '\r' is not part of the token.
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("\r\n".join(SPECIALS + ["a"]).encode())
    assert WordPieceTokenizer.from_vocab_file(str(crlf)).tokenize("A") == ["a"]
