"""zoo.convert.tf_checkpoint reads real TensorFlow checkpoints (written by tf.compat.v1.train.Saver
into fixtures/google_bert_tiny by make_google_bert_fixture.py) tensor for tensor, over every dtype
and two data shards; zoo.convert.hf.load_pretrained turns the google-research/bert directory into a
model with transformers' logits; broken files get errors that name them."""

import hashlib
import json
import shutil
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.convert import hf
from zoo.convert.tf_checkpoint import crc32c, list_tf_checkpoint, read_tf_checkpoint
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.models import bert

FIXTURE = Path(__file__).parent / "fixtures" / "google_bert_tiny"
PREFIX = FIXTURE / "bert_model.ckpt"
MIXED = FIXTURE / "dtypes_sharded" / "mixed.ckpt"
OPTIMIZER_STATE = ("global_step", "bert/embeddings/LayerNorm/gamma/adam_m",
                   "bert/embeddings/LayerNorm/gamma/adam_v")


@pytest.fixture(scope="module")
def manifest():
    """name -> {shape, dtype, sha256} of the arrays handed to TensorFlow."""
    return json.loads((FIXTURE / "variables.json").read_text())


@pytest.fixture(scope="module")
def loaded():
    return hf.load_pretrained(FIXTURE)


def _copy_checkpoint(src_prefix: Path, dst_dir: Path, name: str | None = None) -> Path:
    """Copies a checkpoint's .index and .data-* files into dst_dir (renamed to `name`)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    name = name or src_prefix.name
    for f in src_prefix.parent.glob(src_prefix.name + ".*"):
        shutil.copy(f, dst_dir / (name + f.name[len(src_prefix.name):]))
    return dst_dir / name


# ---- the reader --------------------------------------------------------------------------------


def test_reader_returns_exactly_the_tensors_tensorflow_wrote(manifest):
    arrays = read_tf_checkpoint(PREFIX)
    assert list(arrays) == sorted(manifest)  # every tensor, nothing else, in key order
    for name, want in manifest.items():
        x = arrays[name]
        assert (list(x.shape), str(x.dtype)) == (want["shape"], want["dtype"]), name
        assert hashlib.sha256(x.tobytes()).hexdigest() == want["sha256"], name
    assert arrays["global_step"].dtype == np.int64 and arrays["global_step"] == 1234
    listed = list_tf_checkpoint(PREFIX)
    assert {n: (list(s), str(d)) for n, (s, d) in listed.items()} == {
        n: (m["shape"], m["dtype"]) for n, m in manifest.items()}


def test_prefix_index_file_and_directory_name_the_same_checkpoint():
    by_prefix = read_tf_checkpoint(str(PREFIX))
    for other in (read_tf_checkpoint(Path(f"{PREFIX}.index")), read_tf_checkpoint(FIXTURE)):
        assert other.keys() == by_prefix.keys()
        for name in by_prefix:
            np.testing.assert_array_equal(other[name], by_prefix[name])
    subset = read_tf_checkpoint(PREFIX, names=["global_step", "cls/predictions/output_bias"])
    assert list(subset) == ["global_step", "cls/predictions/output_bias"]
    with pytest.raises(KeyError, match=r"no tensor named \['nope'\]"):
        read_tf_checkpoint(PREFIX, names=["nope"])


def _expected_mixed():
    spec = json.loads((MIXED.parent / "values.json").read_text())
    out = {}
    for name, s in spec.items():
        if s["dtype"] == "string":
            value = np.array([v.encode() for v in np.ravel(s["values"])], dtype=object)
        else:
            dtype = ml_dtypes.bfloat16 if s["dtype"] == "bfloat16" else np.dtype(s["dtype"])
            value = np.array(s["values"], dtype=np.float64 if "float" in s["dtype"] else None)
            value = value.astype(dtype)
        out[name] = (value.reshape(s["shape"]), s["shard"])
    return out


def test_every_dtype_over_two_data_shards(tmp_path):
    expected = _expected_mixed()
    arrays = read_tf_checkpoint(MIXED)
    assert arrays.keys() == expected.keys()
    for name, (want, _) in expected.items():
        got = arrays[name]
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        if want.dtype == object:
            assert got.tolist() == want.tolist()
        else:  # bit-exact: -0.0, subnormals, int extremes
            assert got.tobytes() == want.tobytes(), name
    # Each tensor comes from its own shard: without shard 1, shard 0's tensors still read.
    prefix = _copy_checkpoint(MIXED, tmp_path)
    Path(f"{prefix}.data-00001-of-00002").unlink()
    shard0 = [name for name, (_, shard) in expected.items() if shard == 0]
    assert read_tf_checkpoint(prefix, names=shard0).keys() == set(shard0)
    with pytest.raises(FileNotFoundError, match=r"mixed\.ckpt\.data-00001-of-00002 does not "
                                                r"exist.*2 data shard"):
        read_tf_checkpoint(prefix)


def _crc32c_bitwise(data: bytes) -> int:
    """CRC-32C by its definition: reflected polynomial 0x82F63B78, one bit at a time."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_the_definition_on_both_paths():
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    rng = np.random.default_rng(0)
    for n in (0, 5, 16383, 16384, 40001):  # byte loop below 16 KiB, numpy lanes above
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c(data) == _crc32c_bitwise(data), n
        assert crc32c(data[n // 3:], crc32c(data[: n // 3])) == crc32c(data), n  # continuing


# ---- zoo.convert.hf.load_pretrained --------------------------------------------------------------


def test_google_research_directory_gives_transformers_logits(loaded):
    model, params, config, tokenizer = loaded
    # bert_config.json names no architecture: the cls/ variables make it BertForPreTraining.
    assert isinstance(model, bert.BertForPreTraining)
    google = json.loads((FIXTURE / "bert_config.json").read_text())
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
            config.intermediate_size, config.max_position_embeddings) == (
        google["vocab_size"], google["hidden_size"], google["num_hidden_layers"],
        google["num_attention_heads"], google["intermediate_size"],
        google["max_position_embeddings"])
    ref = np.load(FIXTURE / "expected.npz")
    ids, types, mask = ref["input_ids"], ref["token_type_ids"], ref["attention_mask"]
    positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
    mlm, nsp = jax.jit(lambda p: model.apply({"params": p}, ids, types, mask, positions))(params)
    real = mask.astype(bool)  # padding queries mean nothing (HF lets them attend, we do not)
    want_mlm, want_nsp = ref["prediction_logits"][real], ref["seq_relationship_logits"]
    assert np.abs(want_mlm).max() > 0.5 and np.abs(want_nsp).max() > 0.1  # worth comparing
    assert_close(np.asarray(mlm)[real], want_mlm, 1e-4, err_msg="MLM logits")
    assert_close(np.asarray(nsp), want_nsp, 1e-4, err_msg="NSP logits")
    # vocab.txt without tokenizer_config.json, all lowercase: an uncased tokenizer.
    assert isinstance(tokenizer, WordPieceTokenizer) and tokenizer.lowercase
    assert tokenizer.tokenize("The Cats ran.") == ["the", "cat", "##s", "ran", "."]


def test_optimizer_slots_and_global_step_are_not_loaded(loaded, manifest):
    _, params, _, _ = loaded
    leaves = jax.tree_util.tree_leaves_with_path(params)
    paths = ["/".join(str(k.key) for k in path) for path, _ in leaves]
    assert not [p for p in paths if "adam" in p or "step" in p]
    # Every other variable became a param, bit for bit (e.g. the slotted LayerNorm gain).
    assert len(leaves) == len(manifest) - len(OPTIMIZER_STATE)
    gamma = read_tf_checkpoint(PREFIX, ["bert/embeddings/LayerNorm/gamma"])
    np.testing.assert_array_equal(params["bert"]["embeddings"]["norm"]["scale"],
                                  gamma["bert/embeddings/LayerNorm/gamma"])


def test_config_json_architecture_and_vocab_case(tmp_path):
    """A config.json naming BertModel drops the checkpoint's heads; a vocabulary with capitals
    gives a cased tokenizer unless tokenizer_config.json says otherwise."""
    directory = tmp_path / "encoder"
    _copy_checkpoint(PREFIX, directory)
    config = json.loads((FIXTURE / "bert_config.json").read_text())
    (directory / "config.json").write_text(json.dumps(
        {**config, "model_type": "bert", "architectures": ["BertModel"]}))
    vocab = (FIXTURE / "vocab.txt").read_text().replace("\nthe\n", "\nThe\n")
    (directory / "vocab.txt").write_text(vocab)
    model, params, _, tokenizer = hf.load_pretrained(directory)
    assert isinstance(model, bert.BertModel) and "embeddings" in params
    assert not tokenizer.lowercase
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert hf.load_pretrained(directory)[3].lowercase


# ---- errors ------------------------------------------------------------------------------------


def test_missing_data_shard_is_named(tmp_path):
    prefix = _copy_checkpoint(PREFIX, tmp_path / "ckpt")
    Path(f"{prefix}.data-00000-of-00001").unlink()
    with pytest.raises(FileNotFoundError, match=r"ckpt/bert_model\.ckpt\.data-00000-of-00001 "
                                                r"does not exist.*copy every \.data"):
        read_tf_checkpoint(prefix)
    for f in ("bert_config.json", "vocab.txt"):
        shutil.copy(FIXTURE / f, tmp_path / "ckpt" / f)
    with pytest.raises(FileNotFoundError, match=r"load_pretrained: .*bert_model\.ckpt\.data-"
                                                r"00000-of-00001 does not exist"):
        hf.load_pretrained(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match=r"index .*nowhere\.index does not exist"):
        read_tf_checkpoint(tmp_path / "nowhere")


def test_truncated_or_corrupt_files_are_named(tmp_path):
    prefix = _copy_checkpoint(PREFIX, tmp_path)
    index = Path(f"{prefix}.index")
    data = Path(f"{prefix}.data-00000-of-00001")
    original = index.read_bytes()
    for cut, message in ((len(original) - 10, r"SSTable magic number.*truncated"),
                         (30, r"shorter than an SSTable footer.*truncated")):
        index.write_bytes(original[:cut])
        with pytest.raises(ValueError, match=rf"bert_model\.ckpt\.index .*{message}"):
            read_tf_checkpoint(prefix)
    # A flipped byte inside the index's first block: its crc32c no longer matches.
    index.write_bytes(original[:20] + bytes([original[20] ^ 1]) + original[21:])
    with pytest.raises(ValueError, match=r"bert_model\.ckpt\.index: the block at byte 0 fails "
                                         r"its crc32c"):
        read_tf_checkpoint(prefix)
    index.write_bytes(original)
    # A flipped bit in a tensor's bytes, then a data file cut short.
    payload = data.read_bytes()
    data.write_bytes(payload[:100] + bytes([payload[100] ^ 1]) + payload[101:])
    with pytest.raises(ValueError, match=r"data-00000-of-00001: tensor '.*' fails its crc32c"):
        read_tf_checkpoint(prefix)
    data.write_bytes(payload[:-8])
    with pytest.raises(ValueError, match=r"data-00000-of-00001 is \d+ bytes but tensor .* "
                                         r"truncated"):
        read_tf_checkpoint(prefix)


def test_compressed_block_and_non_checkpoint_are_refused(tmp_path):
    prefix = _copy_checkpoint(PREFIX, tmp_path)
    index = Path(f"{prefix}.index")
    original = bytearray(index.read_bytes())
    # The footer starts with the metaindex and index block handles, varints (offset, size) each;
    # mark the index block snappy-compressed, with a trailer crc32c that agrees (as a snappy
    # table would have).
    pos, handle = 0, []
    for _ in range(4):
        value, shift = 0, 0
        while True:
            byte = original[-48 + pos]
            value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
            if byte < 0x80:
                break
        handle.append(value)
    offset, size = handle[2:]
    original[offset + size] = 1  # snappy
    crc = crc32c(bytes(original[offset: offset + size + 1]))
    masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    original[offset + size + 1: offset + size + 5] = masked.to_bytes(4, "little")
    index.write_bytes(bytes(original))
    with pytest.raises(ValueError, match=r"bert_model\.ckpt\.index: the block at byte \d+ is "
                                         r"snappy-compressed"):
        read_tf_checkpoint(prefix)
    # A vocabulary file posing as a checkpoint index.
    shutil.copy(FIXTURE / "vocab.txt", tmp_path / "fake.index")
    with pytest.raises(ValueError, match=r"fake\.index does not end in the SSTable magic"):
        read_tf_checkpoint(tmp_path / "fake")


def test_directory_with_two_checkpoints_lists_them(tmp_path):
    for f in ("bert_config.json", "vocab.txt"):
        shutil.copy(FIXTURE / f, tmp_path / f)
    _copy_checkpoint(PREFIX, tmp_path)
    _copy_checkpoint(PREFIX, tmp_path, "model.ckpt-2000")
    with pytest.raises(ValueError, match=r"holds 2 TensorFlow checkpoints \(bert_model\.ckpt\."
                                         r"index, model\.ckpt-2000\.index\); give the prefix"):
        read_tf_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"load_pretrained: .* holds 2 TensorFlow checkpoints "
                                         r"\(bert_model\.ckpt\.index, model\.ckpt-2000\.index\)"):
        hf.load_pretrained(tmp_path)
    # One prefix given explicitly still reads.
    assert "global_step" in read_tf_checkpoint(tmp_path / "model.ckpt-2000")


def test_google_directory_without_checkpoint_or_config_is_named(tmp_path):
    shutil.copy(FIXTURE / "bert_config.json", tmp_path / "bert_config.json")
    with pytest.raises(FileNotFoundError, match=r"bert_config\.json but no TensorFlow "
                                                r"checkpoint"):
        hf.load_pretrained(tmp_path)
    (tmp_path / "bert_config.json").unlink()
    _copy_checkpoint(PREFIX, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"holds the TensorFlow checkpoint bert_model\."
                                                r"ckpt\.index but no bert_config\.json"):
        hf.load_pretrained(tmp_path)
