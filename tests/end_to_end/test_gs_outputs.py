"""gs:// everywhere means everywhere: every command that writes files, given a gs:// workdir or
output, writes into the bucket (the local GCS server, the `gcs` fixture) and nothing lands on
local disk under a directory literally named `gs:` (what os.path/open/pathlib/matplotlib make of
'gs://bucket/x': a relative path gs:/bucket/x under the current directory).

Run from a temporary current directory, in-process (the commands' main functions, as their
__main__ blocks call them), on the smallest configs the other tests use. The whole-run story
(prepare, train killed and resumed, eval, all in a bucket, equal to a local run) is
tests/end_to_end/test_cloud_run.py's, in the acceptance tier."""

import json
import os

import jax
import pytest

from configs import bert_pretrain
from configs import word2vec as word2vec_config
from tests.attention_cases import ROOT, png
from zoo import paths

ONE_DEVICE = jax.devices()[:1]


def _no_local_gs(*roots) -> None:
    """No file or directory named `gs:` anywhere under `roots`."""
    for root in roots:
        for directory, dirs, files in os.walk(root):
            found = [n for n in dirs + files if n.startswith("gs:")]
            assert not found, f"a local {os.path.join(directory, found[0])}"


def _exists(path: str) -> bool:
    return paths.as_path(path).exists()


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


@pytest.mark.slow
def test_lm_commands_write_into_the_bucket(gcs, gcs_bucket, cwd, tiny_lm_config,
                                           tmp_path_factory, capsys):
    """train, eval, attention_maps (its default --out under the workdir), curves and
    save_pretrained / load_pretrained, on a 2-step tiny GPT run in a bucket."""
    from zoo.convert import hf
    from zoo.commands import attention_maps, curves, jobs
    from zoo.models import gpt
    from zoo.checkpoints.checkpoint import Checkpointer

    workdir = f"{gcs_bucket}/runs/gpt"
    config = tiny_lm_config(steps=2, eval_every=2)
    config.data.synthetic_entities = 60
    config.sample.num = 0
    jobs.train(config, workdir, devices=ONE_DEVICE)
    jobs.evaluate(config, workdir, devices=ONE_DEVICE)
    for name in ("metrics.jsonl", "summary.json", "eval.json", "checkpoints"):
        assert _exists(f"{workdir}/{name}"), name

    flags = [f"--config={ROOT}/configs/gpt.py:size=tiny", f"--workdir={workdir}",
             *(f"--config.data.{k}={config.data[k]}"
               for k in ("seq_len", "batch_size", "eval_batch_size", "vocab_size",
                         "synthetic_entities"))]
    capsys.readouterr()
    written = attention_maps.main(["attention_maps", *flags, "--text=Lomira lives in the city"])
    want = f"{workdir}/attention/decoder_self.png"
    assert written == [want] and capsys.readouterr().out.split() == [want]
    local_png = cwd / "map.png"
    local_png.write_bytes(paths.read_bytes(want))
    assert int(png(str(local_png)).text["Panels"]) > 0

    curves.plot_training_curves([("gpt", workdir)], f"{gcs_bucket}/plots/curves.png")
    assert paths.read_bytes(f"{gcs_bucket}/plots/curves.png").startswith(b"\x89PNG")

    setup = jobs.build(config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    params = checkpointer.restore(setup.state).params
    checkpointer.close()
    model_config = setup.task.model_config
    assert isinstance(model_config, gpt.GPTConfig)
    exported = f"{gcs_bucket}/exports/gpt2"
    hf.save_pretrained(exported, model_config, params, bos_token_id=1, eos_token_id=2)
    assert _exists(f"{exported}/config.json") and _exists(f"{exported}/model.safetensors")
    with pytest.raises(FileExistsError, match="not empty"):
        hf.save_pretrained(exported, model_config, params)
    hf.save_pretrained(exported, model_config, params, overwrite=True)
    loaded = hf.load_pretrained(exported)
    assert isinstance(loaded[0], gpt.GPT)

    _no_local_gs(cwd, tmp_path_factory.getbasetemp(), ROOT)


@pytest.mark.slow
def test_word2vec_export_writes_into_the_bucket(gcs, gcs_bucket, cwd, tmp_path_factory):
    from zoo import tasks
    from zoo.commands import jobs, word2vec_query

    tasks._REGISTRY.setdefault("word2vec", "zoo.tasks.word2vec:Word2VecTask")
    config = word2vec_config.get_config("size=tiny,mode=skipgram")
    config.train.update(steps=2, log_every=1, eval_every=2, checkpoint_every=2,
                        tensorboard=False)
    workdir = f"{gcs_bucket}/runs/w2v"
    jobs.train(config, workdir, devices=ONE_DEVICE)
    for binary in (False, True):
        export = f"{gcs_bucket}/vectors/{'bin' if binary else 'txt'}/vectors"
        result = word2vec_query.main(
            ["word2vec_query", f"--config={ROOT}/configs/word2vec.py:size=tiny",
             f"--workdir={workdir}", f"--export={export}",
             f"--binary={binary}"])
        assert result["export"] == export
        words, table = word2vec_query.read_vectors(export, binary=binary)
        assert len(words) == table.shape[0] > 0
    _no_local_gs(cwd, tmp_path_factory.getbasetemp(), ROOT)


# Acceptance tier: prepare, train and eval in a bucket also run (killed and resumed) in
# tests/end_to_end/test_cloud_run.py's acceptance test; this one, 17 s on the 2-core box, adds
# the in-process entry points from a temporary cwd.
@pytest.mark.acceptance
def test_prepare_train_eval_from_the_bucket(gcs, gcs_bucket, cwd, tmp_path_factory):
    """`python -m zoo.commands.prepare` writing its tokenizer and shards into the bucket, then
    train.py and eval.py (their main functions) reading them, with the workdir there too."""
    import eval as eval_script
    import train as train_script
    from zoo.commands import prepare
    from zoo.data.readers import text_files
    from zoo.data.synthetic.documents import corpus_splits

    data = f"{gcs_bucket}/data"
    splits = corpus_splits(seed=0, num_entities=100)
    for split in ("train", "validation"):
        text_files.write_text_corpus(f"{data}/{split}.txt", splits[split])
    config = bert_pretrain.get_config("size=tiny")
    config.data.update(source="files", train_files=f"{data}/train.txt",
                       eval_files=f"{data}/validation.txt", shard_mb=0.01, vocab_size=256,
                       seq_len=32, max_predictions_per_seq=5, dupe_factor=1, batch_size=8,
                       eval_batch_size=8, prepared_dir=f"{data}/prepared")
    config.train.update(steps=2, eval_every=2, log_every=1, tensorboard=False)
    workdir = f"{gcs_bucket}/runs/bert"
    prepare.main(config, workdir)
    assert _exists(f"{data}/prepared/train/manifest.json")
    assert _exists(f"{data}/prepared/tokenizer/spm-bpe-256.model")
    train_script.main(config, workdir)
    eval_script.main(config, workdir)
    result = json.loads(paths.read_bytes(f"{workdir}/eval.json"))
    assert result["step"] == 2
    _no_local_gs(cwd, tmp_path_factory.getbasetemp(), ROOT)
