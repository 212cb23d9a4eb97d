import pytest

from zoo.data import synthetic, tokenizers


@pytest.fixture(scope="module")
def sentences():
    return [s for doc in synthetic.corpus_splits()["train"] for s in doc.texts]


def test_trained_tokenizer_round_trips_and_fixes_special_ids(sentences, tmp_path):
    tok = tokenizers.train_sentencepiece(sentences, vocab_size=300)
    assert 100 < tok.vocab_size <= 300
    for s in sentences[:50]:
        ids = tok.encode(s)
        assert min(ids) > tokenizers.EOS_ID  # specials never produced by plain text
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
