"""benchmarks.quality's GPT pairs: zoo's GPT job beside Hugging Face's PyTorch GPT2LMHeadModel
on Shakespeare, character level (gpt) or as GPT-2 tokens (gpt_bpe: nanoGPT's data/shakespeare,
the same split), with nanoGPT's CPU recipe (README "I only have a macbook"):

    4 layers, 4 heads, width 128, context 64, batch 12, 2,000 steps, dropout 0;
    AdamW lr 1e-3, 100 warm-up steps, cosine decay to 1e-4 (min_lr) at step 2,000, betas
    (0.9, 0.99), eps 1e-8, weight decay 0.1 on every parameter with dim >= 2 (nanoGPT's
    configure_optimizers: embeddings decay, biases and LayerNorm do not), clip 1.0;
    val loss = mean over 200 random val batches (eval_iters), every 250 steps.

zoo's side is the job `configs/gpt.py:corpus=shakespeare` (`job_config`): its task, optimizer
and train step, nothing hand-rolled; only its corpus reader is replaced by the shared batches
(its tokenizer would add special ids to the characters; here the vocabulary is nanoGPT's, the
characters alone, on both sides). The peer is
GPT2LMHeadModel from the same GPTConfig (benchmarks.peers.hf_gpt2: same widths, GELU (tanh),
LayerNorm eps, biases, tied output), with Hugging Face's own initialisation.
"""

import dataclasses
from typing import Any

import ml_collections

from benchmarks import peers, quality_data, quality_sides, step_jobs
from configs import gpt as gpt_job


@dataclasses.dataclass(frozen=True)
class Recipe:
    steps: int = 2000
    batch: int = 12
    block: int = 64
    layers: int = 4
    heads: int = 4
    width: int = 128
    learning_rate: float = 1e-3
    min_learning_rate: float = 1e-4
    warmup: int = 100
    eval_every: int = 250
    eval_batches: int = 200  # the final val loss (nanoGPT's eval_iters)
    curve_batches: int = 25  # the curve's points every eval_every steps (the first of the 200)


FULL = Recipe()
# --quick: the same model and optimizer on the fixture corpus, 200 steps (warm-up 20).
QUICK = Recipe(steps=200, warmup=20, eval_every=100, eval_batches=20, curve_batches=20)


def job_config(recipe: Recipe, vocab_size: int, seed: int, tokenizer: str = "chars"
               ) -> ml_collections.ConfigDict:
    """The job `configs/gpt.py:corpus=shakespeare,tokenizer=TOKENIZER` (nanoGPT's CPU recipe
    already: FULL sets the values it has) with the recipe's numbers, so --quick can shrink
    them."""
    config = gpt_job.get_config(f"corpus=shakespeare,tokenizer={tokenizer}")
    w = recipe.width
    config.model.update(num_layers=recipe.layers, num_heads=recipe.heads, embed_dim=w,
                        mlp_dim=4 * w, max_len=recipe.block, dropout_rate=0.0,
                        attention_dropout_rate=0.0, dtype="float32")
    config.data.update(seq_len=recipe.block, batch_size=recipe.batch, vocab_size=vocab_size)
    config.train.update(steps=recipe.steps, seed=seed)  # optim.total_steps follows train.steps
    config.optim.update(name="adamw", learning_rate=recipe.learning_rate,
                        warmup_steps=recipe.warmup, decay="cosine",
                        end_learning_rate=recipe.min_learning_rate, b1=0.9, b2=0.99, eps=1e-8,
                        weight_decay=0.1, clip_norm=1.0)
    return config


def hf_side(model_config, optim: ml_collections.ConfigDict, seed: int, eval_rows: int
            ) -> quality_sides.TorchSide:
    import torch

    torch.manual_seed(seed)
    model = peers.hf_gpt2(model_config)
    return quality_sides.TorchSide(model, lambda x: model(input_ids=x).logits, optim, eval_rows)


def run(corpus: quality_data.CharCorpus | quality_data.GPT2Corpus, recipe: Recipe, seed: int,
        log=print, progress=lambda record: None) -> dict[str, Any]:
    """One seed of the pair: both sides initialised from `seed`, trained in turns on the
    get_batch stream of `seed`, evaluated on the same val batches: the first `curve_batches`
    every `eval_every` steps, all 200 at the end. `progress(record)`: the record so far, after
    every curve point."""
    record = {"pair": corpus.pair, "seed": seed, "recipe": dataclasses.asdict(recipe),
              "vocab_size": corpus.vocab_size, "train_tokens": int(len(corpus.train)),
              "val_tokens": int(len(corpus.val)), "metric": "val"}
    config = job_config(recipe, corpus.vocab_size, seed,
                        "gpt2" if isinstance(corpus, quality_data.GPT2Corpus) else "chars")
    task = step_jobs.make_task("gpt", config, corpus.vocab_size, step_jobs.here())
    eval_rows = min(recipe.eval_batches, 50) * recipe.batch
    zoo = quality_sides.ZooSide(config, task, eval_rows)
    peer = hf_side(task.model_config, config.optim, seed, eval_rows)
    # The evaluation batches do not depend on the training seed: every run is judged on the
    # same val batches (nanoGPT's estimate_loss draws them afresh; fixed ones remove that noise).
    val_x, val_y = quality_data.fixed_batches(corpus.val, 1_000_003, recipe.eval_batches,
                                              recipe.batch, recipe.block)
    rows = recipe.curve_batches * recipe.batch
    curve_sets = {"val_curve": (val_x[:rows], val_y[:rows])}
    final_sets = {"val": (val_x, val_y)}
    batches = quality_data.char_batches(corpus.train, seed, recipe.steps, recipe.batch,
                                        recipe.block)
    try:
        result = quality_sides.train_in_turns(
            [zoo, peer], batches, recipe.steps, recipe.eval_every, curve_sets, final_sets,
            log=log, on_eval=lambda out, step: progress(dict(record, sides=out, steps_done=step)))
        params = {"zoo": zoo.num_params(), "peer": peer.num_params()}
    finally:
        zoo.close()
    return dict(record, params=params, sides=result, steps_done=recipe.steps)
