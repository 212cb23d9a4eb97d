"""benchmarks.quality's RNN pairs: zoo's RNN LM job (configs/rnnlm.py, LSTM and GRU) beside a
torch.nn.LSTM / torch.nn.GRU language model of the same shape, word level on Brown.

Both sides get the same [batch, steps] windows of the contiguous id stream (quality_data.windows),
in the same seeded order, and both start every window from the zero state: zoo's train step is
stateless (its RNN LM resets at document starts and never carries a state from one batch to the
next), so the peer does the same rather than carrying hidden states across windows as PTB's
scripts do. Validation and test perplexity = exp(mean NLL over every window of the split).

The peer is the model a PyTorch user writes: nn.Embedding -> nn.LSTM/nn.GRU(num_layers,
batch_first) -> nn.Linear (or the embedding table, tied, with its own bias), initialised from the
same families as zoo's (zoo.models.rnnlm, zoo.nn.recurrent_cells) so the comparison is of the
training, not of two inits: embedding N(0, 1) (torch's default too), input kernels lecun-normal
(truncated normal, variance 1 / fan-in, per gate), recurrent kernels orthogonal per gate, biases
zero except the LSTM's forget gate at 1, output kernel lecun-normal with a zero bias. PyTorch's
LSTM keeps two bias vectors per gate where zoo's keeps their sum; the peer's bias_hh stays at zero
and frozen, so both sides train the same parameters (the GRU's two biases are zoo's two as well).

The recipe is configs/rnnlm.py:corpus=brown's optimizer (size tiny's) (AdamW, warm-up, cosine, clip 1.0; its
learning rate, betas and decay) with the model widths and step budget of `Recipe`.
"""

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from benchmarks import quality_data, quality_sides
from configs import rnnlm as rnnlm_job
from zoo.tasks import rnnlm as rnnlm_task
from zoo.tasks.base import Task


# Sized for a 2-core CPU shared with other jobs: the 24k-word softmax is most of the work
# (6 H V FLOPs per token trained), so the widths are small and the budget is 300 steps of
# 20 x 35 tokens (about a fifth of an epoch); every pair and seed ~5 min on an idle machine.
@dataclasses.dataclass(frozen=True)
class Recipe:
    steps: int = 300
    batch: int = 20
    window: int = 35  # truncated-BPTT steps (Zaremba et al.'s batch 20 x 35)
    embed: int = 64
    hidden: int = 64
    layers: int = 2
    eval_every: int = 100
    curve_stride: int = 8


FULL = Recipe()
QUICK = Recipe(steps=150, batch=16, window=20, embed=64, hidden=64, eval_every=50,
               curve_stride=1)


def job_config(cell: str, recipe: Recipe, vocab_size: int, seed: int
               ) -> ml_collections.ConfigDict:
    """The job configs/rnnlm.py:cell=<cell>,corpus=brown (size tiny) with the recipe's widths,
    batch and steps; its vocabulary is replaced by quality_data's (count >= 2)."""
    config = rnnlm_job.get_config(f"size=tiny,cell={cell},corpus=brown")
    config.model.update(embed_dim=recipe.embed, hidden_size=recipe.hidden,
                        num_layers=recipe.layers)
    config.data.update(seq_len=recipe.window, batch_size=recipe.batch, vocab_size=vocab_size)
    config.train.update(steps=recipe.steps, seed=seed)  # optim.total_steps follows train.steps
    return config


class WindowLM(rnnlm_task.RNNLanguageModelTask):
    """The RNN LM task's model, loss and eval over a vocabulary of `vocab_size` ids, its corpus
    replaced by the windows benchmarks.quality feeds (as benchmarks.step_jobs does for GPT)."""

    def __init__(self, config: ml_collections.ConfigDict, vocab_size: int):
        Task.__init__(self, config, workdir="")
        self.tokenizer = type("Vocabulary", (), {"vocab_size": vocab_size})()
        self.model_config, self.model = self.build_model()

    def init_batch(self):
        shape = (self.config.data.batch_size, self.config.data.seq_len)
        zeros = np.zeros(shape, np.int32)
        return quality_sides.lm_batch(zeros, zeros)


def torch_rnnlm(cfg, seed: int):
    """(module, logits_fn) of the PyTorch LM equal to zoo's RNNLM of `cfg` (RNNLMConfig)."""
    import torch

    torch.manual_seed(seed)
    h, g = cfg.hidden_size, {"lstm": 4, "gru": 3}[cfg.cell]

    def lecun_normal_(weight, fan_in):
        # flax lecun_normal: truncated (+-2 sd) normal rescaled so the variance is 1 / fan_in.
        std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978
        torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.embed_dim)  # N(0, 1)
            kind = torch.nn.LSTM if cfg.cell == "lstm" else torch.nn.GRU
            self.rnn = kind(cfg.embed_dim, h, cfg.num_layers, batch_first=True)
            if cfg.tie_embeddings:
                self.output_bias = torch.nn.Parameter(torch.zeros(cfg.vocab_size))
            else:
                self.output = torch.nn.Linear(h, cfg.vocab_size)
            with torch.no_grad():
                for k in range(cfg.num_layers):
                    w_ih, w_hh = getattr(self.rnn, f"weight_ih_l{k}"), getattr(
                        self.rnn, f"weight_hh_l{k}")
                    lecun_normal_(w_ih, w_ih.shape[1])
                    for gate in range(g):
                        torch.nn.init.orthogonal_(w_hh[gate * h:(gate + 1) * h])
                    b_ih, b_hh = getattr(self.rnn, f"bias_ih_l{k}"), getattr(
                        self.rnn, f"bias_hh_l{k}")
                    b_ih.zero_()
                    b_hh.zero_()
                    if cfg.cell == "lstm":
                        b_ih[h:2 * h] = 1.0  # forget gate (i, f, g, o)
                        b_hh.requires_grad_(False)  # zoo's LSTM has one bias: b_ih + b_hh
                if not cfg.tie_embeddings:
                    lecun_normal_(self.output.weight, h)
                    self.output.bias.zero_()

        def forward(self, x):
            hs, _ = self.rnn(self.embed(x))  # (B, T, H), from the zero state
            if cfg.tie_embeddings:
                return hs @ self.embed.weight.T + self.output_bias
            return self.output(hs)

    model = LM()
    return model, model


def load_zoo_params(module, params, cfg) -> None:
    """Copies zoo's RNNLM `params` (unboxed numpy) into the torch_rnnlm `module`: the same start
    on both sides, by which tests/benchmarks/test_quality.py checks that the two train alike.
    zoo keeps kernels (in, gate, H) in PyTorch's gate order (LSTM i, f, g, o; GRU r, z, n) and
    the LSTM's one bias, which is PyTorch's bias_ih + bias_hh (bias_hh stays 0)."""
    import torch

    def put(tensor, value):
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(value, np.float32)))

    put(module.embed.weight, params["embed"]["embedding"])
    for k in range(cfg.num_layers):
        layer = params[f"layer_{k}"]
        for name, key in (("weight_ih", "input_kernel"), ("weight_hh", "recurrent_kernel")):
            kernel = np.asarray(layer[key])  # (in, G, H)
            put(getattr(module.rnn, f"{name}_l{k}"), kernel.reshape(kernel.shape[0], -1).T)
        put(getattr(module.rnn, f"bias_ih_l{k}"), np.asarray(layer["bias"]).reshape(-1))
        hh = layer.get("recurrent_bias")
        put(getattr(module.rnn, f"bias_hh_l{k}"),
            np.zeros_like(np.asarray(layer["bias"])).reshape(-1) if hh is None
            else np.asarray(hh).reshape(-1))
    if cfg.tie_embeddings:
        put(module.output_bias, params["output"]["bias"])
    else:
        put(module.output.weight, np.asarray(params["output"]["kernel"]).T)
        put(module.output.bias, params["output"]["bias"])


def run(corpus: quality_data.WordCorpus, cell: str, recipe: Recipe, seed: int, log=print,
        progress=lambda record: None) -> dict[str, Any]:
    """One seed of the `cell` pair: both sides trained in turns on the same windows;
    `progress(record)`: the record so far, after every curve point."""
    record = {"pair": f"{cell}-word-brown", "seed": seed, "recipe": dataclasses.asdict(recipe),
              "vocab_size": corpus.vocab_size,
              "tokens": {k: int(len(v)) for k, v in corpus.splits.items()},
              "metric": "validation"}
    config = job_config(cell, recipe, corpus.vocab_size, seed)
    task = WindowLM(config, corpus.vocab_size)
    x, y = quality_data.windows(corpus.splits["train"], recipe.batch, recipe.window)
    order = quality_data.window_order(len(x), recipe.steps, seed)
    final_sets = {}
    for split in ("validation", "test"):
        ex, ey = quality_data.windows(corpus.splits[split], recipe.batch, recipe.window)
        final_sets[split] = (ex.reshape(-1, recipe.window), ey.reshape(-1, recipe.window))
    # The curve's points: every `curve_stride`-th validation row (the whole of both splits
    # once, at the end: with a 24k-word softmax a full pass costs as much as ~100 train steps).
    val_x, val_y = final_sets["validation"]
    eval_sets = {"validation_part": (val_x[::recipe.curve_stride], val_y[::recipe.curve_stride])}
    zoo = quality_sides.ZooSide(config, task, eval_rows=8 * recipe.batch)
    module, logits_fn = torch_rnnlm(task.model_config, seed)
    peer = quality_sides.TorchSide(module, logits_fn, config.optim, eval_rows=8 * recipe.batch)
    try:
        result = quality_sides.train_in_turns(
            [zoo, peer], ((x[k], y[k]) for k in order), recipe.steps, recipe.eval_every,
            eval_sets, final_sets, log,
            on_eval=lambda out, step: progress(dict(record, sides=out, steps_done=step)))
        params = {"zoo": zoo.num_params(),
                  "peer": sum(p.numel() for p in module.parameters() if p.requires_grad)}
    finally:
        zoo.close()
    return dict(record, train_windows=int(len(x)), params=params, sides=result,
                steps_done=recipe.steps)
