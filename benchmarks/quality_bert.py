"""BERT pretraining (MLM + NSP) beside Hugging Face's PyTorch BertForPreTraining, fed zoo's own
prepared batches: the same masked examples in the same order, the same recipe and step budget.

zoo's side is what train.py runs for `configs/bert_pretrain.py:corpus=brown`: the pretraining
task (its data preparation, model and loss_fn), the config's optimizer and zoo.train.loop's
jitted train and eval steps (benchmarks.step_jobs.build, one device). The peer is
transformers.BertForPreTraining built from the same BertConfig (zoo.convert.bert.config_to_hf),
trained as a PyTorch user trains it: zero_grad, mean MLM loss over the masked positions + mean
NSP loss (benchmarks.peers.bert_loss: HF's own submodules around the masked-position gather),
clip_grad_norm_, AdamW with decay on everything but biases and LayerNorm (HF's run_pretraining
groups), the schedule of zoo.train.optim.make_schedule read step by step. Both are evaluated on
the same eval batches: MLM loss and accuracy over the masked positions, NSP accuracy.

The vocabulary is WordPiece, trained by Hugging Face's `tokenizers` (BertWordPieceTokenizer, the
library HF's own BERT tokenizers come from) on the English training text of the corpora given,
and read by zoo's WordPiece tokenizer from its vocab.txt.
"""

import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from benchmarks import peers, step_jobs
from zoo.train import loop, optim

BERT_METRICS = ("mlm_loss", "mlm_accuracy", "nsp_accuracy")


def train_wordpiece(texts: list[str], out_dir: str, vocab_size: int) -> str:
    """vocab.txt of a lowercased WordPiece vocabulary of `vocab_size` trained on the text
    files `texts` (BERT's special tokens first); reused if already there."""
    path = os.path.join(out_dir, f"wordpiece-{vocab_size}", "vocab.txt")
    if os.path.exists(path):
        return path
    from tokenizers import BertWordPieceTokenizer

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tokenizer = BertWordPieceTokenizer(lowercase=True, strip_accents=True)
    tokenizer.train(texts, vocab_size=vocab_size, min_frequency=2, show_progress=False,
                    special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.save_model(os.path.dirname(path))
    return path


def bert_config(corpus_dir: str, cache_dir: str, vocab: str, steps: int, seed: int,
                size: str = "tiny") -> ml_collections.ConfigDict:
    """The job's config (configs/bert_pretrain.py:size=SIZE,corpus=brown) with the WordPiece
    vocabulary `vocab`, `steps` steps (warm-up and decay as the recipe) and the init seed."""
    from configs import bert_pretrain

    config = bert_pretrain.get_config(f"size={size},corpus=brown,corpus_dir={corpus_dir}")
    config.data.tokenizer = vocab
    config.data.cache_dir = cache_dir
    config.train.steps = steps  # config.optim.total_steps follows (a FieldReference)
    config.train.seed = seed
    return config


class ZooBert:
    """zoo's train and eval steps of the pretraining task."""

    name = "zoo"

    def __init__(self, config: ml_collections.ConfigDict, task):
        self.setup = step_jobs.build(config, task)
        self.train_step = loop.make_train_step(self.setup, config)
        self.eval_step = loop.make_eval_step(self.setup)
        self.state = self.setup.state
        self.task = task

    def num_params(self) -> int:
        return int(sum(np.prod(p.shape) for p in jax.tree.leaves(self.state.params)))

    def step(self, batch: dict[str, np.ndarray]) -> float:
        with jax.set_mesh(self.setup.mesh):
            self.state, metrics = self.train_step(
                self.state, jax.device_put(batch, self.setup.batch_sharding))
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
        sums: dict[str, float] = {}
        with jax.set_mesh(self.setup.mesh):
            for batch in batches:
                out = jax.device_get(self.eval_step(
                    self.state.params, jax.device_put(batch, self.setup.batch_sharding)))
                for k, v in out.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        summary = self.task.summarize(sums)
        return {k: float(summary[k]) for k in BERT_METRICS}


def hf_adamw(model, optim_config: ml_collections.ConfigDict):
    """torch.optim.AdamW as Hugging Face's BERT scripts group it: decay on every parameter but
    the biases and LayerNorm's (zoo.train.optim.decay_mask's split); the learning rate is set
    before each step from zoo's schedule."""
    import torch

    named = list(model.named_parameters())
    exempt = [n.endswith("bias") or "LayerNorm" in n for n, _ in named]
    return torch.optim.AdamW(
        [{"params": [p for (_, p), e in zip(named, exempt) if not e],
          "weight_decay": optim_config.weight_decay},
         {"params": [p for (_, p), e in zip(named, exempt) if e], "weight_decay": 0.0}],
        lr=optim_config.learning_rate, betas=(optim_config.b1, optim_config.b2),
        eps=optim_config.eps)


class HFBert:
    """transformers.BertForPreTraining of the same architecture, trained on the same batches."""

    name = "peer"

    def __init__(self, config: ml_collections.ConfigDict, model_config, seed: int):
        import torch

        self.torch = torch
        torch.manual_seed(seed)
        self.model = peers.hf_bert(model_config)
        self.optim = config.optim
        self.schedule = optim.make_schedule(config.optim)
        self.optimizer = hf_adamw(self.model, config.optim)
        self.steps = 0

    def num_params(self) -> int:
        return peers.num_params(self.model)

    def step(self, batch: dict[str, np.ndarray]) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = float(self.schedule(self.steps))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = peers.bert_loss(self.model, peers.to_torch(batch))
        loss.backward()
        if self.optim.clip_norm:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim.clip_norm)
        self.optimizer.step()
        self.steps += 1
        return float(loss.item())

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
        torch, model = self.torch, self.model
        model.eval()
        mlm_nll = mlm_correct = mlm_weight = nsp_correct = examples = 0.0
        with torch.no_grad():
            for batch in batches:
                b = peers.to_torch(batch)
                out = model.bert(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                                 attention_mask=b["attention_mask"])
                seq = out.last_hidden_state  # (B, T, H)
                index = b["masked_lm_positions"][..., None].expand(-1, -1, seq.shape[-1])
                logits = model.cls.predictions(torch.gather(seq, 1, index)).float()  # (B, P, V)
                logits, ids = logits.flatten(0, 1), b["masked_lm_ids"].flatten()
                weights = b["masked_lm_weights"].flatten()
                nll = torch.nn.functional.cross_entropy(logits, ids, reduction="none")
                mlm_nll += float((nll * weights).sum())
                mlm_correct += float(((logits.argmax(-1) == ids).float() * weights).sum())
                mlm_weight += float(weights.sum())
                nsp = model.cls.seq_relationship(out.pooler_output)  # (B, 2)
                ew = b["example_weight"]
                nsp_correct += float(((nsp.argmax(-1) == b["next_sentence_labels"]).float()
                                      * ew).sum())
                examples += float(ew.sum())
        return {"mlm_loss": mlm_nll / mlm_weight, "mlm_accuracy": mlm_correct / mlm_weight,
                "nsp_accuracy": nsp_correct / examples}


def run_pair(config: ml_collections.ConfigDict, workdir: str, eval_every: int,
             curve_batches: int = 8, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Trains zoo and the peer on the pretraining task's batches, one step each in turns (the
    side that goes first alternating, so load from other processes falls on both alike), and
    evaluates both on the first `curve_batches` eval batches at step 0, every `eval_every` steps
    and at the end (the curve), and on every eval batch at the end (`final`). Returns per side: the curve, the final metrics, seconds per
    step (median) and parameter count; and the vocabulary and train rows."""
    from zoo.tasks.mlm_nsp import PretrainingTask

    task = PretrainingTask(config, workdir)
    eval_batches = list(task.eval_batches(0, 1))
    sides = [ZooBert(config, task), HFBert(config, task.model_config, config.train.seed)]
    out = {s.name: {"curve": [], "step_s": [], "train_loss": [], "params": s.num_params()}
           for s in sides}

    def evaluate(step: int, batches):
        for side in sides:
            metrics = side.evaluate(batches)
            out[side.name]["curve"].append((step, metrics))
            log(f"  step {step:5d} {side.name:4s} "
                + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    steps = int(config.train.steps)
    batches = task.train_batches(0, 1)
    evaluate(0, eval_batches[:curve_batches])
    for i in range(steps):
        batch = next(batches)
        for side in (sides if i % 2 == 0 else sides[::-1]):
            copy = {k: v.copy() for k, v in batch.items()}  # neither side changes the other's
            start = time.perf_counter()
            out[side.name]["train_loss"].append(side.step(copy))
            out[side.name]["step_s"].append(time.perf_counter() - start)
        if (i + 1) % eval_every == 0 or i + 1 == steps:
            evaluate(i + 1, eval_batches[:curve_batches])
    for side in sides:
        out[side.name]["final"] = side.evaluate(eval_batches)
        # The first steps compile (zoo) and warm up allocators (both): the median ignores them.
        out[side.name]["step_s"] = float(np.median(out[side.name]["step_s"][5:]
                                                   or out[side.name]["step_s"]))
        log(f"  final {side.name:4s} " + " ".join(
            f"{k} {v:.4f}" for k, v in out[side.name]["final"].items())
            + f"; {out[side.name]['step_s'] * 1e3:.1f} ms/step")
    out["vocab_size"] = task.tokenizer.vocab_size
    out["train_rows"] = len(task.train_source)
    return out


# The English training text the WordPiece vocabulary is trained on, where fetched.
VOCAB_TEXTS = ("brown", "shakespeare", "bible")


def run(corpus_dir: str, seeds: list[int], steps: int, workdir: str, vocab_size: int = 4096,
        eval_every: int = 500, log: Callable[[str], None] = print
        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pair on Brown for each seed: (header fields, one record per seed)."""
    from zoo.errors import ConfigError

    for name in ("train.txt", "validation.txt"):
        path = os.path.join(corpus_dir, "brown", name)
        if not os.path.isfile(path):
            raise ConfigError(f"{path} not found: fetch the corpus first with `python -m "
                              f"zoo.commands.corpus fetch brown --out {corpus_dir}`")
    texts = [os.path.join(corpus_dir, name, "train.txt") for name in VOCAB_TEXTS]
    texts = [t for t in texts if os.path.exists(t)]
    vocab = train_wordpiece(texts, workdir, vocab_size)
    records = []
    for seed in seeds:
        config = bert_config(corpus_dir, os.path.join(workdir, "data"), vocab, steps, seed)
        log(f"bert-tiny-brown seed {seed}: {steps} steps, vocabulary {vocab}")
        start = time.perf_counter()
        out = run_pair(config, os.path.join(workdir, f"seed{seed}"), eval_every, log=log)
        records.append({"pair": "bert-tiny-brown", "seed": seed, "steps": steps,
                        "train_rows": out["train_rows"], "wall_s": time.perf_counter() - start,
                        "sides": {k: out[k] for k in ("zoo", "peer")}})
    header = {"steps": steps, "vocab_size": vocab_size,
              "vocab_texts": [os.path.relpath(t, corpus_dir) for t in texts]}
    return header, records


def merge(directories: list[str], out: str) -> list[str]:
    """One report from the quality_bert.jsonl of runs made apart: the first run's header with
    every run's commit, the earliest start and the longest wall time."""
    import json

    from benchmarks import quality_bert_report

    headers, records = [], []
    for directory in directories:
        with open(os.path.join(directory, "quality_bert.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        headers.append(lines[0])
        records += lines[1:]
    header = {k: v for k, v in headers[0].items() if k != "record"}
    header.update(zoo_commit=", ".join(sorted({h["zoo_commit"] for h in headers})),
                  started=min(h["started"] for h in headers),
                  wall_s=max(h["wall_s"] for h in headers))
    return quality_bert_report.write(out, header, sorted(records, key=lambda r: r["seed"]))


def main(argv=None) -> int:
    """python -m benchmarks.quality_bert --corpus DIR [--seeds 0,1] [--steps 3000] [--out D]"""
    import argparse
    import datetime
    import sys
    import tempfile

    from benchmarks import machine, quality_bert_report

    parser = argparse.ArgumentParser(description="tiny BERT beside HF BertForPreTraining")
    parser.add_argument("--corpus", default="", help="what `zoo.commands.corpus fetch` wrote "
                        "(brown; --quick without it: a fixture corpus)")
    parser.add_argument("--seeds", default="", help="default 0,1 (--quick: 0)")
    parser.add_argument("--steps", type=int, default=0, help="default 3000 (--quick: 60)")
    parser.add_argument("--eval-every", type=int, default=0, help="default 500 (--quick: 30)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 60 steps, one seed, "
                        "written to a temporary directory unless --out")
    parser.add_argument("--workdir", default="", help="prepared data; default a temporary one")
    parser.add_argument("--out", default="", help="default benchmarks/results/<machine>")
    parser.add_argument("--merge", default="", help="comma-separated result directories of "
                        "runs made apart (e.g. one process per seed) to join into --out")
    args = parser.parse_args(argv)
    if args.merge:
        paths = merge(args.merge.split(","), machine.results_dir(args.out or None))
        print("wrote " + ", ".join(paths), flush=True)
        return 0
    from benchmarks import quality_data
    from zoo import errors

    corpus = args.corpus
    if args.quick and not corpus:
        corpus = quality_data.write_fixture_corpus(tempfile.mkdtemp(prefix="quality_bert_corpus_"))
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    steps = args.steps or (60 if args.quick else 3000)
    # Before torch loads OpenMP: passive waiting (see benchmarks.quality).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        if not corpus:
            raise errors.ConfigError("--corpus DIR is required (or --quick for a fixture corpus)")
        torch_info = peers.setup_torch("cpu")
        started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
        header, records = run(corpus, seeds, steps,
                              args.workdir or tempfile.mkdtemp(prefix="quality_bert_"),
                              eval_every=args.eval_every or (30 if args.quick else 500),
                              log=lambda line: print(line, flush=True))
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    header.update(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, torch=torch_info["torch"],
                  transformers=torch_info["transformers"],
                  mode="quick" if args.quick else "full", corpus=corpus,
                  started=started.strftime("%Y-%m-%d %H:%M UTC"),
                  wall_s=time.perf_counter() - start)
    out = args.out or (tempfile.mkdtemp(prefix="quality_bert_out_") if args.quick else "")
    paths = quality_bert_report.write(machine.results_dir(out or None), header, records)
    print("wrote " + ", ".join(paths), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
