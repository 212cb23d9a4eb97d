"""Shared config pieces: `path.py:key=value,flag` variant parsing (big_vision style) and blocks
every job has (mesh, train loop)."""

import dataclasses
import os

import ml_collections
from ml_collections import config_dict

from zoo.errors import ConfigError
from zoo.models.runtime_fields import RuntimeFields
from zoo.train.partitioning import DEFAULT_RULES


def parse_arg(arg: str | None, **defaults):
    """'size=tiny,phase=1' -> ConfigDict(size='tiny', phase=1), typed by the defaults.

    An unknown key is an error naming it and the known ones, so a typo never silently runs the
    default variant.
    """
    result = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, _, value = item.partition("=")
        if key not in defaults:
            raise ConfigError(f"config variant key {key!r} is unknown; known keys: "
                              f"{sorted(defaults)}")
        kind = type(defaults[key])
        if kind is bool:
            result[key] = value.lower() in ("", "1", "true", "yes")
        else:
            try:
                result[key] = kind(value)
            except ValueError:
                raise ConfigError(f"config variant {key}={value!r} must be {kind.__name__}, "
                                  f"like its default {defaults[key]!r}") from None
    return result


# Where `python -m zoo.commands.corpus fetch NAME --out DIR` put the real corpora: the `corpus_dir`
# variant of every real-text job, relative to the directory the job runs in (or absolute).
CORPUS_DIR = "corpora"


def corpus_data(corpus: str | tuple[str, ...], corpus_dir: str, **files: str) -> dict:
    """config.data keys of a job reading the fetched corpus `corpus` (zoo.data.corpora) from
    `corpus_dir`: source 'files', each key of `files` set to corpus_dir/corpus/<its file>, and
    config.data.corpus / corpus_dir, by which a missing file is reported with the command that
    fetches it (zoo.data.corpora.check_fetched) before the job reads anything.

    Several corpora (a tuple) read the same file of each: every key of `files` becomes the
    comma-separated list corpus_dir/<each corpus>/<its file>, config.data.corpus their names."""
    names = (corpus,) if isinstance(corpus, str) else tuple(corpus)
    return dict(source="files", corpus=",".join(names), corpus_dir=corpus_dir,
                **{key: ",".join(os.path.join(corpus_dir, name, file) for name in names)
                   for key, file in files.items()})


def unknown_corpus(corpus: str, known: tuple[str, ...]) -> ConfigError:
    """The error of a corpus= variant the job has no recipe for."""
    return ConfigError(f"config variant corpus={corpus!r} is not one of this job's real-text "
                       f"corpora {list(known)} ('' = the synthetic default)")


def source_config() -> dict:
    """Where documents come from (zoo/data/readers/sources.py); shared by every text-corpus job."""
    return dict(
        source="synthetic",  # synthetic | files | tfds
        seed=0,
        synthetic_entities=500,  # synthetic source: world size (~0.8 documents per entity)
        train_files="",  # files source: comma-separated globs of BERT-format text files
        eval_files="",
        # tfds source: a dataset prepared (array_record) in a local data_dir, e.g. 'lm1b'
        tfds_name="",
        tfds_data_dir="",  # '' = TFDS's default ($TFDS_DATA_DIR, else ~/tensorflow_datasets)
        tfds_text_key="text",
        tfds_train_split="train",
        tfds_validation_split="validation",  # lm1b has none: 'test', or 'train[:1%]'
        tfds_test_split="test",
        tfds_max_records=0,  # 0 = all; N = the first N records of each split
        tokenizer="",  # a SentencePiece .model or WordPiece vocab.txt; '' = train one (cached)
        tokenizer_type="bpe",  # for a trained SentencePiece model: bpe | unigram
    )


def lm_data_config(tiny: bool) -> dict:
    """The language-model data block: every LM family (GPT, NNLM) reads the same tokenizer,
    packing and split, so their perplexities compare."""
    return dict(
        source_config(),
        vocab_size=1024 if tiny else 32768,
        cache_dir="",  # trained tokenizer; '' = <workdir>/data
        seq_len=64 if tiny else 1024,
        batch_size=32 if tiny else 512,
        eval_batch_size=32 if tiny else 512,
    )


def runtime_model_config(tiny: bool) -> dict:
    """config.model's runtime fields for a Transformer job (zoo.models.runtime_fields: the
    attention kernel, the layer scan, remat, the dtypes): the model's own defaults, except that
    a size beyond tiny scans its layers (one layer compiled) and computes in bfloat16, and
    scan_unroll is 0 (auto: zoo.train.layer_scan settles it for the platform)."""
    fields = {field.name: field.default for field in dataclasses.fields(RuntimeFields)}
    fields.update(scan_layers=not tiny, scan_unroll=0, dtype="float32" if tiny else "bfloat16")
    return fields


def lm_sample_config() -> dict:
    """Text sampled from a trained LM at the end of train.py and by eval.py (num=0: none)."""
    return dict(num=3, prompt="", max_len=48, temperature=0.8, top_k=0, top_p=0.95, seed=0)


def mesh_config() -> ml_collections.ConfigDict:
    # data=-1 takes every device not used by fsdp/tensor, so the default runs anywhere.
    return ml_collections.ConfigDict(
        dict(data=-1, fsdp=1, tensor=1, rules=[list(r) for r in DEFAULT_RULES])
    )


def train_config(steps: ml_collections.FieldReference) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            steps=steps,
            log_every=25,
            eval_every=100,
            checkpoint_every=200,
            keep_checkpoints=3,
            best_metric="",  # an eval metric (e.g. 'perplexity'): also keep its best checkpoint
            best_mode="min",
            grad_accum_steps=1,  # micro-batches per step; the update equals one large batch
            nonfinite="skip",  # NaN/Inf loss or gradients: 'skip' the update, or 'stop'
            # Skip the update of a step whose loss exceeds factor x its running mean (after
            # warmup_steps); stop after max_in_a_row such steps. factor 0 = off.
            loss_spike=dict(factor=0.0, warmup_steps=100, decay=0.99, max_in_a_row=10),
            profile_steps="",  # 'START:STOP': a jax.profiler trace of those steps in workdir
            peak_flops=0.0,  # per-device peak FLOP/s for MFU where the device is not known
            dry_run=False,  # print mesh, per-device memory and FLOPs/step, then exit
            # Params that start this run (fresh optimizer, step 0): a zoo workdir's latest
            # checkpoint, or a Hugging Face / google-research/bert checkpoint directory.
            init_from="",
            seed=0,
            # Dropout's random bits: 'auto' (threefry on a CPU, rbg on GPUs and TPUs),
            # 'threefry', 'rbg' or 'unsafe_rbg' (zoo.train.dropout_rng says why).
            dropout_rng="auto",
            label_smoothing=0.0,
            tensorboard=True,
            # Compiled programs kept across restarts (zoo.train.compilation.compile_cache): local or
            # gs://; '' = $JAX_COMPILATION_CACHE_DIR if set, else <workdir>/compile_cache; 'off' =
            # none.
            compilation_cache_dir="",
            compilation_cache_min_compile_secs=0.0,  # keep programs that took at least this
            # Its bound: the entries used longest ago go as each run starts (0 = none).
            compilation_cache_max_gb=10.0,
            # Several processes: one that sends no heartbeat for this long is declared lost and
            # every other exits (status 1, one line naming it) for the scheduler to relaunch.
            heartbeat_timeout_s=30,
            # A step, eval or checkpoint save slower than factor x the median of its recent
            # ones (and than min_s), or than limit_s at all (the first step's compile
            # included), writes every thread's stack to stderr and exits with status 1.
            # factor 0 / limit_s 0 = that rule off.
            watchdog=dict(factor=20.0, min_s=300.0, limit_s=3600.0),
            # gs:// paths (zoo.paths.configure): each request's connect and read timeout, and
            # one read, write or listing's time with its retries (a silent bucket: ~2.5 min).
            storage=dict(request_timeout_s=20.0, operation_budget_s=180.0),
        )
    )


def finetune_recipes(config: ml_collections.ConfigDict, *, tiny: dict, pretrained: dict) -> None:
    """config.finetune.recipe / recipes for a job that fine-tunes a pretrained encoder, and every
    field a recipe fills set to None ('the recipe's value').

    Two recipes, because a checkpoint's size decides the step size that fine-tunes it: 'tiny'
    (tuned on zoo's tiny pretraining run: a large lr, no dropout) and 'pretrained' (the BERT
    paper's for a real checkpoint: lr 2e-5..5e-5, warmup 10% of the steps, dropout 0.1). The
    default recipe 'auto' is settled when the run starts (zoo.train.loop.resolve_recipe), once
    init_from is known: 'pretrained' for a Hugging Face / google-research directory or a size
    other than tiny, else 'tiny'. A field the user sets (--config.optim.learning_rate=...) is no
    longer None, so it wins over either recipe: no guessing from values.

    Args:
      tiny, pretrained: {section: {key: value}} of config fields (e.g. optim.learning_rate),
        both recipes naming the same fields.
    """
    if {s: sorted(v) for s, v in tiny.items()} != {s: sorted(v) for s, v in pretrained.items()}:
        raise ValueError("the tiny and pretrained recipes must set the same fields")
    config.finetune.recipe = "auto"  # auto | tiny | pretrained
    config.finetune.recipes = dict(tiny=tiny, pretrained=pretrained)
    for section, values in tiny.items():
        for key, value in values.items():
            lazy = isinstance(value, ml_collections.FieldReference)  # e.g. steps // 10
            kind = value.get_type() if lazy else type(value)
            # A typed None: still settable from the command line, and visibly unset.
            config[section][key] = config_dict.placeholder(kind)


def recipe(learning_rate, warmup_steps, dropout: float) -> dict:
    """A fine-tuning recipe's fields (finetune_recipes): peak lr, warmup steps (an int, or a
    FieldReference such as `steps // 10` that follows --config.train.steps) and the encoder's
    dropout."""
    return dict(optim=dict(learning_rate=learning_rate, warmup_steps=warmup_steps),
                model=dict(dropout_rate=dropout, attention_dropout_rate=dropout))
