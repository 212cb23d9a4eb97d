"""Fine-tuning recipes (config.finetune.recipe): a Hugging Face BERT directory in init_from
trains with BERT's recipe for a real checkpoint, not the tiny job's lr 2e-3; an explicit
learning rate wins over either recipe; zoo's own tiny pretraining keeps the tiny recipe. The
printed line, the logged lr and the optimizer's own updates all show the chosen step size."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bert_pretrain
from configs import classify as classify_config
from configs import squad as squad_config
from zoo.convert import hf
from zoo.commands import jobs
from zoo.data.readers import sources
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.errors import ConfigError
from zoo.models import bert
from zoo.train import recipe

ONE_DEVICE = jax.devices()[:1]  # nothing here is about sharding
STEPS = 10  # BERT's 10% warmup is then 1 step: the second update runs at the peak lr


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # the synthetic data, written once per module


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    """A tiny Hugging Face BERT directory (config.json, model.safetensors, vocab.txt) whose
    vocabulary covers the synthetic world's words."""
    config = bert_pretrain.get_config("size=tiny")
    config.data.synthetic_entities = 100
    words = sorted({w for doc in sources.load_documents(config.data, "train") for s in doc
                    for w in re.findall(r"\w+|[^\w\s]", s.lower())})
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
    model_config = bert.config_for_size("tiny", vocab_size=tokenizer.vocab_size,
                                        max_position_embeddings=128)
    params = bert.BertModel(model_config).init(jax.random.key(0), np.zeros((1, 8), np.int32))
    directory = tmp_path_factory.mktemp("hf") / "bert"
    hf.save_pretrained(str(directory), model_config, params["params"], tokenizer)
    return str(directory)


def _config(job, init_from, cache_dir):
    if job == "squad":
        config = squad_config.get_config("size=tiny")
    else:  # classify:full, classify:frozen
        config = classify_config.get_config(f"size=tiny,strategy={job.split(':')[1]}")
        config.data.seq_len = 64
    config.data.update(synthetic_entities=100, vocab_size=512, cache_dir=str(cache_dir),
                       batch_size=16, eval_batch_size=16)
    config.train.update(steps=STEPS, eval_every=STEPS, log_every=1, tensorboard=False,
                        init_from=init_from)
    return config


def _lr_of_second_update(setup) -> float:
    """The step size of the run's optimizer at its second update, read off its updates of a
    constant gradient: Adam turns g into lr * g / (|g| + eps) ~ lr, and biases have no weight
    decay (a frozen encoder's are zero: the largest is a trained one's)."""
    params = setup.state.params
    grads = jax.tree.map(jnp.ones_like, params)
    opt_state = setup.optimizer.init(params)
    update = jax.jit(setup.optimizer.update)  # one program, not one per eager op
    for _ in range(2):
        updates, opt_state = update(grads, opt_state, params)
    return max(float(jnp.max(jnp.abs(u))) for path, u in
               jax.tree_util.tree_leaves_with_path(updates) if path[-1].key == "bias")


def _recipe_line(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("fine-tuning recipe")]
    return line


# The pretrained recipes: each config's size=base values.
@pytest.mark.parametrize("job,lr", [("squad", 3e-5), ("classify:full", 2e-5),
                                    ("classify:frozen", 1e-3)])
def test_a_pretrained_directory_gets_the_pretrained_recipe(hf_bert, cache, tmp_path, capsys, job,
                                                           lr):
    config = _config(job, hf_bert, cache)
    setup = jobs.build(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    line = _recipe_line(capsys.readouterr().out)
    assert line.startswith(f"fine-tuning recipe 'pretrained' (config.train.init_from="
                           f"'{hf_bert}' is a pretrained checkpoint directory): "
                           f"optim.learning_rate={lr:g}, optim.warmup_steps=1 of {STEPS} steps, "
                           "model.attention_dropout_rate=0.1, model.dropout_rate=0.1;"), line
    assert _lr_of_second_update(setup) == pytest.approx(lr, rel=2e-3)
    # The caller's config is left as given: None still means "the recipe's".
    assert config.optim.learning_rate is None and config.finetune.recipe == "auto"


@pytest.mark.slow
def test_the_run_logs_the_pretrained_learning_rate(hf_bert, cache, tmp_path, capsys):
    config = _config("squad", hf_bert, cache)
    jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    out = capsys.readouterr().out
    assert _recipe_line(out).startswith("fine-tuning recipe 'pretrained'")
    assert f"initialised bert from {hf_bert}" in out
    records = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    lrs = [r["lr"] for r in records if r["split"] == "train"]
    # Warmup of 1 step to 3e-5, then linear decay to 0 at step 10.
    np.testing.assert_allclose(lrs, [3e-5 * (STEPS - s) / (STEPS - 1) for s in
                                     range(1, STEPS + 1)], rtol=1e-5, atol=1e-12)


def test_an_explicit_learning_rate_wins_over_the_recipe(hf_bert, cache, tmp_path, capsys):
    config = _config("squad", hf_bert, cache)
    config.optim.learning_rate = 1e-4
    setup = jobs.build(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    line = _recipe_line(capsys.readouterr().out)
    # The rest of the recipe still applies.
    assert ("'pretrained'" in line and "optim.learning_rate=0.0001 (set explicitly)" in line
            and "optim.warmup_steps=1 of 10 steps" in line), line
    assert _lr_of_second_update(setup) == pytest.approx(1e-4, rel=2e-3)


@pytest.mark.slow
def test_a_zoo_pretraining_run_keeps_the_tiny_recipe(tiny_pretrained_bert, tmp_path, capsys):
    init_from = str(tiny_pretrained_bert / "pretrain")
    config = _config("squad", init_from, tiny_pretrained_bert / "cache")
    setup = jobs.build(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    line = _recipe_line(capsys.readouterr().out)
    assert line.startswith(f"fine-tuning recipe 'tiny' (config.model.size='tiny', "
                           f"config.train.init_from='{init_from}' is a zoo run): "
                           f"optim.learning_rate=0.002, optim.warmup_steps=100 of {STEPS} steps, "
                           "model.attention_dropout_rate=0, model.dropout_rate=0;"), line
    # The tiny recipe warms up over 100 steps: the second update runs at 2e-3 / 100.
    assert _lr_of_second_update(setup) == pytest.approx(2e-3 / 100, rel=2e-3)


def test_recipe_choice_without_a_run(capsys):
    base = squad_config.get_config("size=base")
    resolved = recipe.resolve(base)  # no init_from: a base-size encoder is BERT's
    assert (resolved.finetune.recipe, resolved.optim.learning_rate) == ("pretrained", 3e-5)
    assert resolved.optim.warmup_steps == 550  # 10% of the base recipe's 5,500 steps
    assert "config.model.size='base'" in capsys.readouterr().out
    assert recipe.resolve(resolved) is resolved  # settled: nothing to do, nothing printed
    assert capsys.readouterr().out == ""
    tiny = squad_config.get_config("size=tiny")
    tiny.finetune.recipe = "pretrained"  # chosen explicitly
    assert recipe.resolve(tiny).optim.learning_rate == 3e-5
    assert "(config.finetune.recipe='pretrained')" in capsys.readouterr().out
    tiny.finetune.recipe = "bert"
    with pytest.raises(ConfigError, match=r"config\.finetune\.recipe='bert' must be 'auto' or "
                                          r"one of \['pretrained', 'tiny'\]"):
        recipe.resolve(tiny)
