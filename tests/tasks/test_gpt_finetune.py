"""GPT's second stage through the one loop: a tiny GPT language model, pretrained briefly on the
synthetic corpus, fine-tuned from its checkpoint on the synthetic relation task (the split BERT
is scored on), clearly beats the majority class; eval.py's path reproduces it."""

import jax
import numpy as np
import pytest

from configs import gpt as gpt_config
from configs import gpt_classify
from zoo import tasks
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import jobs
from zoo.data.synthetic import classification as synthetic_classification
from zoo.data.tokenizers import base as tokenizers
from zoo.models.runtime_fields import RUN_CHOICES
from zoo.train import init_from

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """<root>/lm: 40 steps of the tiny GPT on the default synthetic corpus (its tokenizer in
    <root>/lm/data, where fine-tuning finds it)."""
    root = tmp_path_factory.mktemp("gpt_finetune")
    config = gpt_config.get_config("size=tiny")
    config.data.update(seq_len=32, batch_size=16, eval_batch_size=16, vocab_size=256)
    config.train.update(steps=40, log_every=20, eval_every=40, checkpoint_every=40,
                        tensorboard=False)
    config.optim.warmup_steps = 4
    config.sample.num = 0
    jobs.train(config, str(root / "lm"), devices=ONE_DEVICE)
    return root


def _config(root, **train):
    config = gpt_classify.get_config("size=tiny,task=relation")
    config.data.update(synthetic_entities=200, seq_len=32, batch_size=16, eval_batch_size=32,
                       cache_dir=str(root / "cache"))
    config.train.update(dict(dict(steps=120, eval_every=120, log_every=40, checkpoint_every=120,
                                  tensorboard=False, init_from=str(root / "lm")), **train))
    config.optim.warmup_steps = 10
    return config


@pytest.fixture(scope="module")
def finetuned(pretrained):
    workdir = pretrained / "relation"
    return workdir, jobs.train(_config(pretrained), str(workdir), devices=ONE_DEVICE)


@pytest.mark.slow
def test_init_from_fills_the_gpt_subtree_with_the_language_model(pretrained):
    setup = jobs.build(_config(pretrained), str(pretrained / "start"), devices=ONE_DEVICE)
    state = init_from.init_params(str(pretrained / "lm"), setup.state, "gpt")
    lm = Checkpointer(str(pretrained / "lm"))
    expected = lm.restore_params(setup.state.params["gpt"])
    lm.close()
    for got, want in zip(jax.tree.leaves(state.params["gpt"]), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.acceptance  # the 120-step fine-tuning must beat the majority class
def test_fine_tuned_gpt_beats_the_majority_class(finetuned):
    _, summary = finetuned
    splits = synthetic_classification.classification_splits(0, "relation", 200)
    labels = [ex["label"] for ex in splits["train"]]
    majority = max(set(labels), key=labels.count)
    majority_accuracy = 100.0 * np.mean([ex["label"] == majority
                                         for ex in splits["validation"]])
    assert summary["accuracy"] > majority_accuracy + 30.0, (summary, majority_accuracy)
    # The objective as documented: class loss + 0.5 x the language-modelling loss.
    assert summary["loss"] == pytest.approx(summary["cls_loss"] + 0.5 * summary["lm_loss"],
                                            rel=1e-5)
    assert {"f1", "mcc"} <= set(summary)


@pytest.mark.acceptance  # on the same fine-tuned run
def test_eval_reproduces_the_final_accuracy_and_writes_predictions(finetuned, pretrained):
    workdir, summary = finetuned
    result = jobs.evaluate(_config(pretrained), str(workdir), devices=ONE_DEVICE)
    assert result["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-9)
    assert result["majority_accuracy"] < result["accuracy"]
    lines = (workdir / "predictions" / "predictions.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    assert 100.0 * np.mean([r[1] == r[2] for r in rows]) == pytest.approx(summary["accuracy"])


@pytest.mark.slow
def test_a_tokenizer_of_another_vocabulary_is_an_error_naming_both_sizes(pretrained, tmp_path):
    other = tokenizers.train_sentencepiece(
        ["Lomira lives in Fagagirmar.", "Trige is the mayor of Stoukron."] * 20, vocab_size=40)
    path = str(tmp_path / "other.model")
    other.save(path)
    config = _config(pretrained)
    config.data.tokenizer = path
    with pytest.raises(ValueError, match=f"{other.vocab_size}.*config.data.tokenizer"):
        tasks.get("gpt_classify")(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_fine_tunes_from_a_gpt2_directory_with_its_byte_level_tokenizer(pretrained, tmp_path):
    """An imported GPT-2 (config.json + model.safetensors + vocab.json + merges.txt): the `gpt`
    subtree starts as the directory's weights and the text goes through GPT-2's byte-level
    BPE (zoo.data.tokenizers.gpt2_bpe), found in the same directory."""
    ByteLevelBPETokenizer = pytest.importorskip(
        "tokenizers", reason="trains the GPT-2 files; comes with the parity extra "
        "(pip install -e '.[parity]')").ByteLevelBPETokenizer
    from zoo.convert import hf
    from zoo.data.tokenizers import gpt2_bpe
    from zoo.models import gpt

    directory = tmp_path / "gpt2"
    splits = synthetic_classification.classification_splits(0, "relation", 200)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([ex["text_a"] for ex in splits["train"]], vocab_size=400,
                            special_tokens=[gpt2_bpe.ENDOFTEXT])
    model_config = gpt.config_for_size("tiny", vocab_size=bpe.get_vocab_size(), max_len=64)
    params = gpt.GPT(model_config).init(jax.random.key(7), np.zeros((1, 8), np.int32))["params"]
    hf.save_pretrained(directory, model_config, params)
    bpe.save_model(str(directory))

    config = _config(pretrained, init_from=str(directory), steps=2, eval_every=2,
                     checkpoint_every=2)
    config.model.update(attention_block=64, scan_unroll=2)
    task = tasks.get("gpt_classify")(config, str(tmp_path / "run"))
    assert isinstance(task.tokenizer, gpt2_bpe.GPT2Tokenizer)
    # The checkpoint fixes the architecture; every choice it leaves open comes from config.model
    # (the imported layers stay unscanned: zoo.convert.hf.load_pretrained's layout).
    for key in RUN_CHOICES:
        want = False if key == "scan_layers" else config.model[key]
        assert getattr(task.model_config, key) == want, key
    setup = jobs.build(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    state = init_from.init_params(str(directory), setup.state, "gpt",
                                  jobs.load_pretrained_params)
    for got, want in zip(jax.tree.leaves(state.params["gpt"]),
                         jax.tree.leaves(jax.tree.map(np.asarray, params))):
        np.testing.assert_array_equal(np.asarray(got), want)
    summary = jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    assert np.isfinite(summary["loss"]) and 0.0 <= summary["accuracy"] <= 100.0
