"""zoo.convert.hf: Hugging Face directories written by transformers load as zoo models with the same
logits (padding and segments in use); directories written by zoo load in transformers with the
original tensors, bit for bit; pytorch_model.bin, sharded, bf16 and architecture-less
checkpoints; the tokenizer files; atomic writes; and the errors a wrong directory gets."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.numerics import assert_close

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from zoo.convert import hf, hf_save  # noqa: E402
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer  # noqa: E402
from zoo.models import bert, gpt  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
         "a", "dog", "ran", "##s", "##ed", "Big", "big", ".", ",", "is", "it", "who", "?", "x",
         "##y", "z", "q", "w", "e", "r"]
BERT_SIZES = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=48, max_position_embeddings=16,
                  type_vocab_size=2)
# GPT-2's default bos/eos (50256) lie outside a 50-token vocabulary.
GPT2_SIZES = dict(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                  bos_token_id=0, eos_token_id=0)
B, T = 2, 7
IDS = np.array([[2, 5, 6, 3, 7, 8, 3], [2, 9, 10, 3, 11, 0, 0]], np.int64)
TYPES = np.array([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 0, 0]], np.int64)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], np.int64)  # row 1: 2 pads
REAL = MASK.astype(bool)
POSITIONS = np.array([[1, 5], [4, 2]], np.int64)  # MLM predictions, real tokens only
TOKENS = np.array([[1, 7, 3, 42, 9, 0, 12], [5, 5, 30, 2, 17, 8, 49]], np.int64)  # GPT-2
ARCHITECTURES = ("BertForQuestionAnswering", "BertForSequenceClassification",
                 "BertForPreTraining", "GPT2LMHeadModel")


def _hf_model(arch, seed=0, **overrides):
    """A tiny transformers model in eval mode, every parameter N(0, 0.2^2) (HF's zero biases and
    unit LayerNorm gains would hide a wrongly mapped bias or gain)."""
    if arch.startswith("GPT2"):
        config = transformers.GPT2Config(**{**GPT2_SIZES, **overrides})
    else:
        labels = 3 if arch == "BertForSequenceClassification" else 2
        config = transformers.BertConfig(**{**BERT_SIZES, "num_labels": labels, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _write_vocab(directory, lowercase=False):
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase}))


@pytest.fixture(scope="module", params=ARCHITECTURES)
def checkpoint(request, tmp_path_factory):
    """(transformers model, the directory its save_pretrained wrote, with a cased vocab.txt for
    BERT)."""
    model = _hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    if not request.param.startswith("GPT2"):
        _write_vocab(directory)
    return model, directory


def _t(x):
    return torch.from_numpy(np.asarray(x))


def _hf_outputs(model):
    """What each model predicts, as numpy; BERT's span logits at real tokens only (ours give
    padding queries no attention, HF lets them attend: the outputs there mean nothing)."""
    name = type(model).__name__
    with torch.no_grad():
        if name.startswith("GPT2"):
            return [model(_t(TOKENS)).logits.numpy()]
        out = model(_t(IDS), attention_mask=_t(MASK), token_type_ids=_t(TYPES))
    if name == "BertForQuestionAnswering":
        return [out.start_logits.numpy()[REAL], out.end_logits.numpy()[REAL]]
    if name == "BertForSequenceClassification":
        return [out.logits.numpy()]
    mlm = out.prediction_logits.numpy()[np.arange(B)[:, None], POSITIONS]  # (B, P, V)
    return [mlm, out.seq_relationship_logits.numpy()]


def _zoo_outputs(model, params):
    if isinstance(model, gpt.GPT):
        return [np.asarray(jax.jit(lambda p: model.apply({"params": p}, TOKENS))(params))]
    args = [x.astype(np.int32) for x in (IDS, TYPES, MASK)]
    if isinstance(model, bert.BertForPreTraining):
        args.append(POSITIONS.astype(np.int32))
    out = jax.jit(lambda p: model.apply({"params": p}, *args))(params)
    if isinstance(model, bert.BertForQuestionAnswering):
        return [np.asarray(out[0])[REAL], np.asarray(out[1])[REAL]]
    return [np.asarray(x) for x in (out if isinstance(out, tuple) else (out,))]


def _assert_same_tensors(a, b):
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


# ---- transformers -> zoo -> transformers -------------------------------------------------------


def test_loaded_model_gives_transformers_logits(checkpoint):
    hf_model, directory = checkpoint
    arch = type(hf_model).__name__
    model, params, config, tokenizer = hf.load_pretrained(directory)
    assert type(model).__name__ == ("GPT" if arch.startswith("GPT2") else arch)
    if arch == "BertForSequenceClassification":
        assert model.num_labels == 3
    ref = _hf_outputs(hf_model)
    assert max(np.abs(r).max() for r in ref) > 0.5  # worth comparing
    for got, want in zip(_zoo_outputs(model, params), ref, strict=True):
        assert got.shape == want.shape
        assert_close(got, want, 1e-4, err_msg=arch)
    if arch.startswith("GPT2"):
        # transformers' save_pretrained of a model writes no vocab.json / merges.txt
        assert isinstance(config, gpt.GPTConfig) and tokenizer is None
    else:
        assert isinstance(config, bert.BertConfig)
        assert isinstance(tokenizer, WordPieceTokenizer)
        assert not tokenizer.lowercase  # do_lower_case=false from tokenizer_config.json
        assert tokenizer.tokenize("Big cats") == ["Big", "cat", "##s"]


def test_saved_directory_loads_in_transformers_with_the_same_tensors(checkpoint, tmp_path):
    hf_model, directory = checkpoint
    arch = type(hf_model).__name__
    _, params, config, tokenizer = hf.load_pretrained(directory)
    extra = dict(bos_token_id=0, eos_token_id=0) if arch.startswith("GPT2") else {}
    out = tmp_path / "exported"
    hf.save_pretrained(out, config, params, tokenizer, **extra)  # architecture from the params
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == [arch]
    # The same tensors as transformers' own file (no pooler for QA, no tied copies), exactly.
    ours, theirs = (load_file(str(d / "model.safetensors")) for d in (out, directory))
    assert ours.keys() == theirs.keys()
    for name, x in theirs.items():
        assert ours[name].dtype == x.dtype, name
        np.testing.assert_array_equal(ours[name], x, err_msg=name)
    loaded = getattr(transformers, arch).from_pretrained(out).eval()
    _assert_same_tensors(loaded, hf_model)
    for got, want in zip(_hf_outputs(loaded), _hf_outputs(hf_model), strict=True):
        np.testing.assert_array_equal(got, want)
    if tokenizer is not None:  # vocab.txt + tokenizer_config.json: transformers reads them
        theirs = transformers.AutoTokenizer.from_pretrained(out)
        text = "Big cats sat on the mat, who ran?"
        assert theirs(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
        assert tokenizer.encode(text)[:3] == [VOCAB.index("Big"), 6, 13]  # cased: 'Big' kept


def test_task_models_load_through_auto_classes(tmp_path):
    """config.json's architectures are what AutoModelFor* and the pipelines dispatch on."""
    for arch, auto in (("BertForQuestionAnswering", "AutoModelForQuestionAnswering"),
                       ("BertForSequenceClassification",
                        "AutoModelForSequenceClassification")):
        source = _hf_model(arch, seed=1)
        source.save_pretrained(tmp_path / arch)
        _, params, config, _ = hf.load_pretrained(tmp_path / arch)
        hf.save_pretrained(tmp_path / (arch + "-zoo"), config, params)
        loaded = getattr(transformers, auto).from_pretrained(tmp_path / (arch + "-zoo"))
        assert type(loaded).__name__ == arch
        _assert_same_tensors(loaded, source)
    # architecture='BertModel' writes the encoder of a model with a head.
    hf.save_pretrained(tmp_path / "encoder", config, params, architecture="BertModel")
    encoder = transformers.AutoModel.from_pretrained(tmp_path / "encoder")
    assert type(encoder).__name__ == "BertModel"
    _assert_same_tensors(encoder, source.bert)


# ---- other file layouts ------------------------------------------------------------------------


def _copy_without_weights(source, target):
    target.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)


def test_pytorch_bin_sharded_and_bf16_checkpoints_give_the_same_params(tmp_path):
    model = _hf_model("BertForQuestionAnswering")
    (tmp_path / "st").mkdir()
    model.save_pretrained(tmp_path / "st")
    _, want, _, _ = hf.load_pretrained(tmp_path / "st")

    _copy_without_weights(tmp_path / "st", tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    for name in ("bin", "sharded"):
        _, got, _, _ = hf.load_pretrained(tmp_path / name)
        jax.tree.map(np.testing.assert_array_equal, got, want)

    # A bfloat16 checkpoint: safetensors.numpy reads it; params come out in float32.
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    _, got, config, _ = hf.load_pretrained(tmp_path / "bf16")
    assert config.param_dtype == "float32"
    rounded = jax.tree.map(lambda x: np.asarray(x, jax.numpy.bfloat16).astype(np.float32), want)
    jax.tree.map(np.testing.assert_array_equal, got, rounded)


def test_config_without_architectures_takes_the_head_from_the_weights(tmp_path):
    source = _hf_model("BertForSequenceClassification")
    source.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["architectures"], config["id2label"], config["label2id"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, params, _, tokenizer = hf.load_pretrained(tmp_path)
    assert isinstance(model, bert.BertForSequenceClassification) and model.num_labels == 3
    assert params["classifier"]["kernel"].shape == (32, 3) and tokenizer is None


def test_tokenizer_json_as_transformers_v5_writes_it(tmp_path):
    """transformers v5 saves tokenizer.json without vocab.txt: its WordPiece vocabulary and
    BertNormalizer options make the same tokenizer as transformers'."""
    _write_vocab(tmp_path, lowercase=True)
    theirs = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=True)
    target = tmp_path / "v5"
    theirs.save_pretrained(target)
    assert (target / "tokenizer.json").exists() and not (target / "vocab.txt").exists()
    _hf_model("BertModel").save_pretrained(target)
    model, _, _, ours = hf.load_pretrained(target)
    assert isinstance(model, bert.BertModel) and ours.lowercase
    text = "The BIG dogs ran, who sat? Xy"
    assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]
    assert ours.tokenize(text)[:3] == ["the", "big", "dog"]


def test_a_gpt2_directory_loads_its_byte_level_bpe(tmp_path):
    """vocab.json + merges.txt beside a GPT-2's weights: load_pretrained hands back zoo's
    byte-level BPE, whose ids are transformers' GPT2TokenizerFast's for the same files."""
    from tokenizers import ByteLevelBPETokenizer

    corpus = ["The animal didn't cross the street because it was too tired.",
              "Spaces  twice, tabs\tand newlines\n; naïve café, 東京 and emoji 🙂."] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=300, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(tmp_path))
    _hf_model("GPT2LMHeadModel", vocab_size=bpe.get_vocab_size()).save_pretrained(tmp_path)
    model, _, config, ours = hf.load_pretrained(tmp_path)
    assert isinstance(model, gpt.GPT) and config.vocab_size == bpe.get_vocab_size()
    theirs = transformers.GPT2TokenizerFast(str(tmp_path / "vocab.json"),
                                            str(tmp_path / "merges.txt"))
    for text in corpus[:2] + ["  leading spaces", "unseen wörds 🙂🙂", ""]:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == text


# ---- atomic writes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qa_export(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qa")
    _hf_model("BertForQuestionAnswering").save_pretrained(directory)
    _write_vocab(directory)
    _, params, config, tokenizer = hf.load_pretrained(directory)
    return config, params, tokenizer


def test_save_refuses_to_clobber_and_overwrite_replaces_the_whole_directory(qa_export,
                                                                           tmp_path):
    config, params, tokenizer = qa_export
    target = tmp_path / "model"
    target.mkdir()
    (target / "tokenizer.json").write_text("{}")  # stale: would shadow the new vocab.txt
    with pytest.raises(FileExistsError, match=r"model exists and is not empty.*overwrite=True"):
        hf.save_pretrained(target, config, params, tokenizer)
    assert sorted(p.name for p in target.iterdir()) == ["tokenizer.json"]
    hf.save_pretrained(target, config, params, tokenizer, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp dirs left


def test_a_failed_save_leaves_no_directory_and_the_old_one_intact(qa_export, tmp_path,
                                                                  monkeypatch):
    config, params, tokenizer = qa_export

    def crash(*args):
        raise OSError("disk full")

    # The model files are written by then: only the tokenizer's are missing when it fails.
    monkeypatch.setattr(hf_save, "_write_wordpiece", crash)
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(tmp_path / "new", config, params, tokenizer)
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    with pytest.raises(OSError, match="disk full"):
        hf.save_pretrained(old, config, params, tokenizer, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert [p.name for p in old.iterdir()] == ["config.json"]
    assert (old / "config.json").read_text() == "{}"


# ---- errors ------------------------------------------------------------------------------------


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere is not a directory"):
        hf.load_pretrained(tmp_path / "nowhere")
    bare = tmp_path / "no_weights"
    bare.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no_weights/config\.json does not exist"):
        hf.load_pretrained(bare)
    (bare / "config.json").write_text(transformers.BertConfig(**BERT_SIZES).to_json_string())
    (bare / "tf_model.h5").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no_weights has no weights file: expected "
                                                r"model\.safetensors or pytorch_model\.bin.*"
                                                r"tf_model\.h5.*params_from_tf_variables"):
        hf.load_pretrained(bare)


def test_unsupported_architectures_and_model_types_list_the_supported(tmp_path):
    config = transformers.BertConfig(**BERT_SIZES).to_dict()
    for architectures, model_type, message in (
        (["BertForMaskedLM"], "bert", r"architecture 'BertForMaskedLM' is not supported"),
        ([], "roberta", r"model_type 'roberta' is not supported"),
        (["GPT2LMHeadModel"], "bert", r"'GPT2LMHeadModel' does not belong to model_type 'bert'"),
    ):
        (tmp_path / "config.json").write_text(json.dumps(
            {**config, "architectures": architectures, "model_type": model_type}))
        with pytest.raises(ValueError, match=message) as error:
            hf.load_pretrained(tmp_path)
        assert str(tmp_path / "config.json") in str(error.value)
        if model_type == "bert" and architectures == ["BertForMaskedLM"]:
            assert "supported: BertModel, BertForPreTraining, BertForQuestionAnswering, " \
                   "BertForSequenceClassification, GPT2LMHeadModel, GPT2Model" in str(error.value)


def test_corrupt_or_mismatched_weights_name_the_file(tmp_path):
    model = _hf_model("BertForQuestionAnswering")
    model.save_pretrained(tmp_path / "st")
    (tmp_path / "st" / "model.safetensors").write_bytes(b"\x07" * 64)
    with pytest.raises(ValueError, match=r"st/model\.safetensors is not a readable safetensors"):
        hf.load_pretrained(tmp_path / "st")
    _copy_without_weights(tmp_path / "st", tmp_path / "bin")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"bin/pytorch_model\.bin is not a readable PyTorch"):
        hf.load_pretrained(tmp_path / "bin")
    # Weights of a 3-layer model under this 2-layer config.json.
    _hf_model("BertForQuestionAnswering", num_hidden_layers=3).save_pretrained(tmp_path / "deep")
    shutil.copy(tmp_path / "st" / "config.json", tmp_path / "deep" / "config.json")
    with pytest.raises(ValueError, match=r"(?s)deep/model\.safetensors: .*unexpected keys: "
                                         r"bert\.encoder\.layer\.2\."):
        hf.load_pretrained(tmp_path / "deep")


def test_save_errors(qa_export, tmp_path):
    config, params, tokenizer = qa_export
    with pytest.raises(ValueError, match=r"architecture='GPT2LMHeadModel' is not a bert "
                                         r"architecture; use one of \['BertModel'"):
        hf.save_pretrained(tmp_path / "a", config, params, architecture="GPT2LMHeadModel")
    with pytest.raises(ValueError, match=r"missing params: classifier/bias"):
        hf.save_pretrained(tmp_path / "b", config, params,
                           architecture="BertForSequenceClassification")
    with pytest.raises(ValueError, match=r"\['architectures'\] are not config\.json extras"):
        hf.save_pretrained(tmp_path / "d", config, params, architectures=["BertModel"])
    gpt_config = gpt.GPTConfig(vocab_size=50, max_len=16, num_layers=1, num_heads=2, embed_dim=8,
                               mlp_dim=16)
    with pytest.raises(ValueError, match=r"byte-level BPE"):
        hf.save_pretrained(tmp_path / "c", gpt_config, {}, tokenizer)
    assert list(tmp_path.iterdir()) == []  # nothing is created for a refused save


def test_a_checkpoint_directory_in_a_bucket_loads_like_the_local_one(qa_export, gcs_bucket,
                                                                     tmp_path):
    import fsspec

    config, params, tokenizer = qa_export
    local = tmp_path / "qa"
    hf.save_pretrained(local, config, params, tokenizer)
    fsspec.filesystem("gs").put(str(local), f"{gcs_bucket}/qa".removeprefix("gs://"),
                                recursive=True)
    _, from_bucket, config_b, tokenizer_b = hf.load_pretrained(f"{gcs_bucket}/qa")
    assert config_b == config and tokenizer_b.vocab_size == tokenizer.vocab_size
    assert jax.tree.structure(from_bucket) == jax.tree.structure(params)
    for x, y in zip(jax.tree.leaves(from_bucket), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(FileNotFoundError, match=r"gs://.*/nothing is not a directory"):
        hf.load_pretrained(f"{gcs_bucket}/nothing")


def test_a_bucket_directory_is_read_only_as_far_as_the_load_needs(gcs_knobs, gcs_bucket,
                                                                 tmp_path):
    """A hub directory holds its weights several times over (sharded safetensors, a
    pytorch_model.bin, Keras and Flax copies): from a bucket, the load reads the configs, the
    tokenizer and one set of weights. Before: every object under the directory."""
    import fsspec

    model = _hf_model("BertForQuestionAnswering")
    hub = tmp_path / "hub"
    model.save_pretrained(hub, max_shard_size="20KB")
    _write_vocab(hub)
    torch.save(model.state_dict(), hub / "pytorch_model.bin")
    for name in ("tf_model.h5", "flax_model.msgpack", "onnx/model.onnx"):
        (hub / name).parent.mkdir(exist_ok=True)
        (hub / name).write_bytes(os.urandom(1 << 12))
    fsspec.filesystem("gs").put(str(hub), f"{gcs_bucket}/hub".removeprefix("gs://"),
                                recursive=True)
    mark = gcs_knobs.mark()
    _, got, _, tokenizer = hf.load_pretrained(f"{gcs_bucket}/hub")
    _, want, _, _ = hf.load_pretrained(hub)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert tokenizer is not None
    read = {r["object"].removeprefix("hub/") for r in gcs_knobs.requests(since=mark)
            if r["op"] == "read"}
    shards = sorted(p.name for p in hub.glob("model-*.safetensors"))
    assert len(shards) > 1
    assert read == {"config.json", "model.safetensors.index.json", "vocab.txt",
                    "tokenizer_config.json", *shards}, read

    (hub / "model.safetensors.index.json").unlink()
    for name in ["pytorch_model.bin", *shards]:
        (hub / name).unlink()
    fsspec.filesystem("gs").rm(f"{gcs_bucket}/hub".removeprefix("gs://"), recursive=True)
    fsspec.filesystem("gs").put(str(hub), f"{gcs_bucket}/hub".removeprefix("gs://"),
                                recursive=True)
    mark = gcs_knobs.mark()
    with pytest.raises(FileNotFoundError, match=r"hub has no weights file: .*It has "
                                                r"tf_model\.h5, flax_model\.msgpack"):
        hf.load_pretrained(f"{gcs_bucket}/hub")
    assert not [r for r in gcs_knobs.requests(since=mark) if r["op"] == "read"]
