"""python -m zoo.commands.attention_maps on what a user points it at: trained GPT,
GPT-classifier, RNN seq2seq and (in a process of its own) Transformer translation workdirs, a
Hugging Face BERT directory and a GPT-2 directory with --tokenizer; the maps drawn are the
checkpoint's, not a fresh initialisation's; jobs without attention are refused before the
workdir is read; its errors are one line without a traceback. The extraction and drawing it
calls: test_attention_maps.py."""

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import gpt_classify as gpt_classify_config
from configs import rnn_translate as rnn_translate_config
from configs import translate as translate_config
from tests import attention_cases as cases
from tests.attention_cases import (ATTENTIONS, BERT_CONFIG, GPT_CONFIG, IDS, ROOT, perturbed,
                                   png)
from tests.numerics import assert_close
from tests.process_env import process_env
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import attention_maps as am
from zoo.commands import jobs
from zoo.errors import ConfigError
from zoo.models import gpt

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]


@pytest.fixture(scope="module")
def wordpiece():
    return cases.wordpiece()


@pytest.fixture(scope="module")
def bert_params():
    return cases.bert_params()


@pytest.fixture(scope="module")
def spm():
    return cases.spm()


GPT_FLAG = f"--config={ROOT}/configs/gpt.py:size=tiny"
# What tests/conftest.py's tiny_lm_config changes in config.data, as flags the command repeats.
LM_DATA_KEYS = ("seq_len", "batch_size", "eval_batch_size", "vocab_size", "synthetic_entities")


def _capture_maps(monkeypatch):
    drawn = []
    draw = am.draw

    def recording(maps, path, **kw):
        drawn.append(maps)
        return draw(maps, path, **kw)

    monkeypatch.setattr(am, "draw", recording)
    return drawn


@pytest.mark.slow
def test_command_on_a_trained_gpt_workdir(tiny_lm_config, tmp_path, monkeypatch, capsys):
    config = tiny_lm_config(steps=2)
    config.data.synthetic_entities = 60  # a smaller world than the default: faster
    config.sample.num = 0
    workdir = str(tmp_path / "lm")
    jobs.train(config, workdir, devices=ONE_DEVICE)
    capsys.readouterr()  # the training log
    flags = [GPT_FLAG, f"--workdir={workdir}",
             *(f"--config.data.{k}={config.data[k]}" for k in LM_DATA_KEYS)]
    drawn = _capture_maps(monkeypatch)
    text = "Lomira lives in the city"
    paths = am.main(["attention_maps", *flags, f"--text={text}", "--heads=0,3"])
    want_path = os.path.join(workdir, "attention", "decoder_self.png")
    assert paths == [want_path] and capsys.readouterr().out.split() == [want_path]
    assert png(want_path).text["Panels"] == "4"  # 2 layers x heads 0, 3
    # The maps are those of the trained checkpoint, not of a fresh initialisation.
    setup = jobs.build(config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    trained = checkpointer.restore(setup.state).params
    checkpointer.close()
    tokenizer = setup.task.tokenizer
    (want,) = am.gpt_maps(setup.task.model, trained, tokenizer, text)
    (fresh,) = am.gpt_maps(setup.task.model, setup.state.params, tokenizer, text)
    assert_close(drawn[0].weights, want.weights, 1e-6)
    assert np.abs(drawn[0].weights - fresh.weights).max() > 1e-4
    assert drawn[0].query_tokens[0] == tokenizer.id_to_token(tokenizer.bos_id)


def test_command_on_a_hugging_face_bert_directory(tmp_path, bert_params, wordpiece, monkeypatch,
                                                  capsys):
    from zoo.convert import hf

    directory = tmp_path / "bert"
    hf.save_pretrained(directory, BERT_CONFIG, bert_params, wordpiece)
    drawn = _capture_maps(monkeypatch)
    out = tmp_path / "maps"
    paths = am.main(["attention_maps", f"--pretrained={directory}", "--text=the animal",
                     "--text_b=it was tired", f"--out={out}", "--layers=0,2"])
    assert paths == [str(out / "encoder_self.png")] and os.path.isfile(paths[0])
    assert png(paths[0]).text["Layers"] == "0,2"
    (want,) = am.bert_maps(BERT_CONFIG, bert_params, wordpiece, "the animal", "it was tired")
    assert drawn[0].query_tokens == want.query_tokens
    assert_close(drawn[0].weights, want.weights, 1e-5)


def test_command_on_a_gpt2_directory_needs_a_tokenizer(tmp_path, spm, monkeypatch):
    """A GPT-2 directory without vocab.json + merges.txt (save_pretrained writes none):
    --tokenizer supplies one, or the error says so."""
    from zoo.convert import hf

    config = dataclasses.replace(GPT_CONFIG, vocab_size=spm.vocab_size)
    params = perturbed(gpt.GPT(config).init(jax.random.key(5), IDS)["params"], seed=5)
    directory, model_file = tmp_path / "gpt2", str(tmp_path / "spm.model")
    hf.save_pretrained(directory, config, params, bos_token_id=0, eos_token_id=0)
    spm.save(model_file)
    flags = [f"--pretrained={directory}", "--text=one plus three", f"--out={tmp_path}"]
    with pytest.raises(ValueError, match="--tokenizer"):
        am.main(["x", *flags])
    drawn = _capture_maps(monkeypatch)
    assert am.main(["x", *flags, f"--tokenizer={model_file}"]) == [
        str(tmp_path / "decoder_self.png")]
    (want,) = am.gpt_maps(gpt.GPT(config), params, spm, "one plus three")
    assert_close(drawn[0].weights, want.weights, 1e-5)
    # A tokenizer with more ids than the model's vocabulary is refused, not clamped.
    small = dataclasses.replace(GPT_CONFIG, vocab_size=8)
    with pytest.raises(ValueError, match="vocabulary has 8 entries"):
        am.gpt_maps(gpt.GPT(small), gpt.GPT(small).init(jax.random.key(0), IDS[:, :2])["params"],
                    spm, "one plus three")


def test_command_errors(tmp_path):
    config_flag = GPT_FLAG
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        am.main(["x", config_flag, f"--workdir={missing}", "--text=hi"])
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text=hi"])
    assert os.listdir(empty) == []  # nothing built or created in a wrong workdir
    with pytest.raises(ValueError, match="--text: the text is empty"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text= "])
    with pytest.raises(ValueError, match="--pretrained=DIR"):
        am.main(["x", "--text=hi"])
    with pytest.raises(ValueError, match="--heads=a"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text=hi", "--heads=a"])
    with pytest.raises(ValueError, match="not both"):
        am.main(["x", config_flag, f"--workdir={empty}", f"--pretrained={empty}", "--text=hi"])
    # As a user runs it: one line saying what is wrong, no traceback.
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.attention_maps", config_flag,
                           f"--workdir={missing}", "--text=hi"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "zoo.commands.attention_maps: --workdir=")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("config, family", [
    ("elmo.py:size=tiny", "ELMo's biLM"),
    ("nnlm.py", "the NNLM"),
    ("word2vec.py", "word2vec"),
    ("rnnlm.py", "the RNN language model"),
    ("feature_classify.py:kind=elmo", "the feature classifier"),
    ("rnn_translate.py:attention=none", "RNN seq2seq with attention='none'"),
])
def test_command_refuses_jobs_without_attention_before_reading_the_workdir(tmp_path, config,
                                                                          family):
    workdir = tmp_path / "run"
    flag = f"--config={ROOT}/configs/{config}"
    with pytest.raises(ConfigError) as raised:
        am.main(["x", flag, f"--workdir={workdir}", "--text=hi"])
    assert str(raised.value).startswith(f"{flag}: no attention maps for {family}")
    assert "configs/gpt_classify.py" in str(raised.value)  # the families that have maps
    assert not workdir.exists()  # said at once: no data, tokenizer or checkpoint work


def test_command_without_attention_is_one_line_and_exit_status_1(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.commands.attention_maps",
         "--config=configs/elmo.py:size=tiny", f"--workdir={tmp_path}",
         "--text=The animal didn't cross the street"],
        cwd=ROOT, env=_one_device_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "zoo.commands.attention_maps: --config=configs/elmo.py:size=tiny: no attention maps for "
        "ELMo's biLM (two LSTM language models, no attention); attention maps come from "
        "Transformer translation (configs/translate.py)")


# ---- the command on trained translation and classification runs ------------------------------


def _one_device_env():
    """The suite's environment on one device, as a user's shell would run the command: the
    tracebacks ZOO_DEBUG shows off."""
    env = process_env(1)
    env.pop("ZOO_DEBUG", None)
    return env


def _short_run(config, **data):
    """2 steps, greedy eval, nothing else: a checkpoint to read, not a model to judge."""
    config.data.update(data)
    config.train.update(steps=2, log_every=2, tensorboard=False, best_metric="")
    if "decode" in config.get("eval", {}):
        config.eval.update(decode="greedy", num_samples=0)
    return config


@pytest.fixture(scope="module")
def rnn_workdirs(tmp_path_factory):
    """attention -> (workdir, the command's --config flags) of a 2-step tiny RNN seq2seq run,
    trained on first use; the runs share one data cache (one SentencePiece model)."""
    root, runs = tmp_path_factory.mktemp("rnn_translate"), {}
    data = dict(synthetic_pairs=200, batch_size=8, eval_batch_size=32,
                cache_dir=str(root / "cache"))

    def get(attention):
        if attention not in runs:
            config = rnn_translate_config.get_config(f"attention={attention}")
            workdir = str(root / attention)
            jobs.train(_short_run(config, **data), workdir, devices=ONE_DEVICE)
            runs[attention] = workdir, [
                f"--config={ROOT}/configs/rnn_translate.py:attention={attention}",
                f"--workdir={workdir}", *(f"--config.data.{k}={v}" for k, v in data.items())]
        return runs[attention]

    return get


# The fast tier runs the command on the `general` run, which checks the most; the other scorings
# train a run each for the same command path (acceptance), and every scoring's maps are checked
# in-process against the model's own softmax (tests/eval/test_attention_maps.py).
@pytest.mark.parametrize("attention", [
    a if a == "general" else pytest.param(a, marks=pytest.mark.acceptance) for a in ATTENTIONS])
@pytest.mark.slow
def test_command_on_a_trained_rnn_seq2seq_workdir(attention, rnn_workdirs, monkeypatch, capsys):
    workdir, flags = rnn_workdirs(attention)
    capsys.readouterr()  # the training log
    drawn = _capture_maps(monkeypatch)
    paths = am.main(["attention_maps", *flags, "--text=一加三"])
    want = os.path.join(workdir, "attention", "alignment.png")
    out = capsys.readouterr().out.splitlines()
    assert paths == [want] and out[1:] == [want] and out[0].startswith("translation: ")
    assert png(want).text["Title"].startswith("alignment") and png(want).text["Panels"] == "1"
    (m,) = drawn
    assert m.kind == "alignment" and m.weights.shape[:2] == (1, 1)
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    if attention != "general":
        return
    # The rows and the printed translation are those of the trained checkpoint's greedy output.
    setup = jobs.build(am._flags(["x", *flags]).config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    trained = checkpointer.restore_params(setup.state.params)
    checkpointer.close()
    tokenizer = setup.task.tokenizer
    (want_maps,) = am.alignment_maps(setup.task.model, trained, tokenizer, "一加三")
    assert m.query_tokens == want_maps.query_tokens
    assert_close(m.weights, want_maps.weights, 1e-6)
    ids = [tokenizer.token_to_id(t) for t in m.query_tokens]
    ids = ids[:-1] if ids[-1] == tokenizer.eos_id else ids
    assert out[0] == f"translation: {tokenizer.decode(ids)}"


@pytest.mark.slow
def test_command_on_a_transformer_translation_workdir_end_to_end(tmp_path):
    """As a user runs it, in a process of its own: the greedy translation, then the three PNGs."""
    data = dict(synthetic_pairs=200, batch_size=8, eval_batch_size=32,
                cache_dir=str(tmp_path / "cache"))
    workdir, out = tmp_path / "run", tmp_path / "maps"
    jobs.train(_short_run(translate_config.get_config("size=tiny"), **data), str(workdir),
               devices=ONE_DEVICE)
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.commands.attention_maps",
         "--config=configs/translate.py:size=tiny", f"--workdir={workdir}", "--text=一加三",
         f"--out={out}", "--layers=0", "--heads=0",
         *(f"--config.data.{k}={v}" for k, v in data.items())],
        cwd=ROOT, env=_one_device_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    want = [str(out / f"{kind}.png") for kind in ("encoder_self", "decoder_self", "cross")]
    assert lines[0].startswith("translation: ") and lines[1:] == want, proc.stdout
    assert [png(p).text["Title"] for p in want] == [
        "encoder self-attention", "decoder self-attention (causal)",
        "cross-attention (decoder query -> source key)"]


@pytest.mark.slow
def test_command_on_a_gpt_classifier_workdir(tmp_path, monkeypatch, capsys):
    data = dict(synthetic_entities=60, seq_len=32, batch_size=8, eval_batch_size=32,
                vocab_size=128)
    workdir = tmp_path / "run"
    jobs.train(_short_run(gpt_classify_config.get_config("size=tiny,task=relation"), **data),
               str(workdir), devices=ONE_DEVICE)
    capsys.readouterr()
    drawn = _capture_maps(monkeypatch)
    paths = am.main(["x", f"--config={ROOT}/configs/gpt_classify.py:size=tiny,task=relation",
                     f"--workdir={workdir}", "--text=Lomira lives in the city", "--layers=1",
                     *(f"--config.data.{k}={v}" for k, v in data.items())])
    assert paths == [str(workdir / "attention" / "decoder_self.png")]
    assert capsys.readouterr().out.split() == paths  # no translation line for a classifier
    (m,) = drawn
    assert m.kind == "decoder_self" and m.query_tokens[-1] == "[extract]"
    assert m.weights.shape[:2] == (2, 4) and png(paths[0]).text["Panels"] == "4"
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
