"""`save_pretrained`: a zoo BERT or GPT model written as a Hugging Face directory that
transformers' `from_pretrained` (and zoo.convert.hf.load_pretrained) reads, appearing whole or not
at all, locally or on gs://. zoo.convert.hf re-exports it (its documented path).
"""

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import numpy as np
from safetensors import numpy as safetensors_numpy

from zoo import paths
from zoo.convert import bert as bert_convert
from zoo.convert import gpt2 as gpt2_convert
from zoo.convert.hf_files import (BERT_ARCHITECTURE, CONFIG_FILE, SAFETENSORS_FILE,
                                  SUPPORTED_ARCHITECTURES, TIED_COPIES, TOKENIZER_CONFIG_FILE,
                                  VOCAB_FILE, bert_head_of)
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.models import bert, gpt


def save_pretrained(path: str | os.PathLike, model_config: bert.BertConfig | gpt.GPTConfig,
                    params: Mapping[str, Any], tokenizer: WordPieceTokenizer | None = None, *,
                    architecture: str | None = None, overwrite: bool = False,
                    **hf_config: Any) -> None:
    """Writes a directory that transformers' `from_pretrained` (and `load_pretrained`) reads.

    Files: config.json, model.safetensors (as HF saves them: without the tied copies of the
    word embeddings), and for a WordPiece tokenizer vocab.txt + tokenizer_config.json. The
    directory appears whole or not at all: everything is written (and fsynced) into a hidden
    sibling directory first, which is then renamed into place. A gs://... `path` (no rename
    there) is written locally first, then uploaded file by file with config.json last.

    Args:
      path: the directory to create, local or gs://bucket/....
      model_config: a BertConfig or GPTConfig.
      params: the model's params (boxed or not; a {"params": ...} dict is unwrapped).
      tokenizer: a zoo WordPieceTokenizer (BERT only) or None.
      architecture: the HF class to write, one of SUPPORTED_ARCHITECTURES of the config's
        family; None picks it from the params (BERT: the head they hold; GPT: GPT2LMHeadModel).
        'BertModel' with a head model's params writes their encoder alone.
      overwrite: replace an existing non-empty `path` (the whole directory: stale files such as
        an old tokenizer.json would otherwise shadow the new ones).
      **hf_config: extra config.json fields, e.g. id2label, bos_token_id / eos_token_id (give
        them for a GPT-2 vocabulary smaller than HF's default ids, 50256).

    Raises:
      ValueError: an architecture that does not fit the config or params, or a tokenizer this
        cannot write.
      FileExistsError: `path` exists, is not empty, and overwrite is False.
    """
    reserved = sorted({"architectures", "model_type", "num_labels"} & set(hf_config))
    if reserved:
        raise ValueError(f"save_pretrained: {reserved} are not config.json extras: pass "
                         "architecture=...; model_type and the labels follow from the model")
    params = nn.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if isinstance(model_config, bert.BertConfig):
        state, config_json = _bert_files(model_config, params, architecture, tokenizer, hf_config)
    elif isinstance(model_config, gpt.GPTConfig):
        if tokenizer is not None:
            raise ValueError("save_pretrained: tokenizer: a GPT-2 directory needs a byte-level "
                             "BPE tokenizer, which zoo does not have; pass tokenizer=None")
        arch = architecture or "GPT2LMHeadModel"
        _check_architecture(arch, "gpt2")
        state = gpt2_convert.params_to_hf(params, model_config,
                                          lm_head=SUPPORTED_ARCHITECTURES[arch][1])
        config_json = gpt2_convert.config_to_hf(model_config, architectures=[arch], **hf_config)
    else:
        raise ValueError(f"save_pretrained: model_config must be a BertConfig or GPTConfig, got "
                         f"{type(model_config).__name__}")
    state = {name: x for name, x in state.items() if name not in TIED_COPIES}

    def write(directory: Path) -> None:
        (directory / CONFIG_FILE).write_text(json.dumps(config_json, indent=2, sort_keys=True)
                                             + "\n", encoding="utf-8")
        # format=pt: what transformers expects of the files it reads.
        safetensors_numpy.save_file(state, str(directory / SAFETENSORS_FILE),
                                    metadata={"format": "pt"})
        if tokenizer is not None:
            _write_wordpiece(directory, tokenizer, model_config)

    if paths.is_remote(path):
        _write_remote_directory(paths.as_path(path), write, overwrite)
    else:
        _write_directory(Path(path), write, overwrite)


def _check_architecture(arch: str, family: str) -> None:
    if SUPPORTED_ARCHITECTURES.get(arch, (None,))[0] != family:
        choices = [a for a, (f, _) in SUPPORTED_ARCHITECTURES.items() if f == family]
        raise ValueError(f"save_pretrained: architecture={arch!r} is not a {family} "
                         f"architecture; use one of {choices}")


def _bert_files(config: bert.BertConfig, params: Mapping[str, Any], architecture: str | None,
                tokenizer: Any, extra: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict]:
    if architecture is None:
        head = bert_head_of(params)
        architecture = BERT_ARCHITECTURE[head]
    _check_architecture(architecture, "bert")
    head = SUPPORTED_ARCHITECTURES[architecture][1]
    if head == "none" and "bert" in params:  # the encoder of a model with a head
        params = params["bert"]
    state = bert_convert.params_to_hf(params, config, heads=head if head != "none" else False)
    num_labels = None
    if head == "sequence_classification":
        num_labels = state["classifier.bias"].shape[0]
        labels = extra.get("id2label")
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"save_pretrained: id2label has {len(labels)} labels but the "
                             f"classifier has {num_labels}")
    if tokenizer is not None:
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise ValueError(
                f"save_pretrained: tokenizer must be a WordPieceTokenizer (written as "
                f"{VOCAB_FILE}) or None, got {type(tokenizer).__name__}; HF's BERT has no "
                "SentencePiece tokenizer"
            )
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"save_pretrained: the tokenizer has {tokenizer.vocab_size} tokens "
                             f"but the model's vocab_size is {config.vocab_size}")
        extra = {"pad_token_id": tokenizer.pad_id, **extra}
    config_json = bert_convert.config_to_hf(config, num_labels=num_labels,
                                            architectures=[architecture], **extra)
    return state, config_json


def _write_wordpiece(directory: Path, tokenizer: WordPieceTokenizer,
                     config: bert.BertConfig) -> None:
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    # vocab.txt is one token per line with trailing whitespace stripped on reading.
    bad = [t for t in tokens if "\n" in t or t != t.rstrip()]
    if bad:
        raise ValueError(f"save_pretrained: tokens {bad[:5]} cannot be written to {VOCAB_FILE} "
                         "(a newline or trailing whitespace)")
    (directory / VOCAB_FILE).write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    options = dict(
        tokenizer_class="BertTokenizer",
        do_lower_case=tokenizer.lowercase,
        strip_accents=tokenizer.strip_accents,
        tokenize_chinese_chars=tokenizer.tokenize_chinese_chars,
        unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=config.max_position_embeddings,
    )
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(options, indent=2) + "\n",
                                                   encoding="utf-8")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_directory(path: Path, write: Callable[[Path], None], overwrite: bool) -> None:
    """Runs write(tmp) in a sibling temp directory and renames it to `path` (atomic on POSIX)."""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"save_pretrained: {path} exists and is not a directory")
    replacing = path.is_dir() and any(path.iterdir())
    if replacing and not overwrite:
        raise FileExistsError(f"save_pretrained: {path} exists and is not empty; pass "
                              "overwrite=True to replace it (the whole directory)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A sibling, so the final rename stays on one filesystem; mkdir (not mkdtemp) so the
    # directory gets the umask's permissions rather than 0700.
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        write(tmp)
        for f in tmp.iterdir():
            _fsync(f)
        if replacing:
            # Move the old directory aside, the new one in, then drop the old: a crash in
            # between leaves `path` absent (the old copy beside it), never half-written.
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)  # replaces an empty directory atomically
        _fsync(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_remote_directory(path: Any, write: Callable[[Path], None], overwrite: bool) -> None:
    """`_write_directory` for a gs:// `path` (an epath.Path): GCS has no directories and no
    rename, so write(tmp) runs in a local temporary directory and each file is then uploaded
    whole (one object each, zoo.paths.write_atomic), config.json last: a reader that finds
    config.json finds the weights and tokenizer beside it. Replacing deletes the old objects
    first, so a crash during the upload leaves no config.json (never an old config beside new
    weights)."""
    if path.is_file():
        raise FileExistsError(f"save_pretrained: {path} exists and is not a directory")
    replacing = path.is_dir() and any(path.iterdir())
    if replacing and not overwrite:
        raise FileExistsError(f"save_pretrained: {path} exists and is not empty; pass "
                              "overwrite=True to replace it (the whole directory)")
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        local = Path(tmp)
        write(local)
        names = sorted((f.name for f in local.iterdir()), key=lambda n: (n == CONFIG_FILE, n))
        if replacing:
            path.rmtree()
        for name in names:
            paths.write_atomic(path / name, (local / name).read_bytes())
