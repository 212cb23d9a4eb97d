"""BERT fine-tuning beside Hugging Face's PyTorch BertForSequenceClassification, fed zoo's own
prepared batches: SpamAssassin ham / spam and Brown's 15 genres (configs/classify.py's
corpus=spam_assassin | brown_genre), from one and the same starting point.

    python -m benchmarks.quality_bert_finetune --corpus DIR [--seeds 0,1] [--steps 600]

The starting point: zoo's tiny BERT pretrained on Brown (MLM + NSP, the WordPiece vocabulary of
benchmarks.quality_bert, `--pretrain-steps` steps of configs/bert_pretrain.py:corpus=brown's
recipe), written as a Hugging Face directory by zoo.convert.hf_save.save_pretrained. Pretraining
parity is benchmarks.quality_bert's pair; this one isolates fine-tuning, so both sides start
from exactly the same weights, the new classifier head included:

* zoo's side is what train.py runs for `configs/classify.py:corpus=...` with
  --config.train.init_from=<that directory> and the 'tiny' fine-tuning recipe (lr 1e-3, 100
  warm-up steps, linear decay, encoder dropout 0, classifier dropout 0.1): the classification
  task (its data, tokenizer, model and loss), zoo.train.init_from.init_params (the job's own
  import of a Hugging Face directory) and zoo.train.loop's jitted steps (benchmarks.step_jobs).
* The peer is transformers.BertForSequenceClassification of the same config (classifier_dropout
  given, as HF would otherwise reuse the encoder's), loaded with zoo's initial params
  (zoo.convert.bert.params_to_hf) and trained as run_glue.py trains it: mean cross-entropy,
  clip_grad_norm_, AdamW without decay on biases and LayerNorm, zoo's schedule step by step.

Both sides see the same batches in the same order, one step each in turns (the side that goes
first alternating); both are evaluated on the whole validation split: loss, accuracy, F1 (the
spam class for SpamAssassin, macro over the 15 genres for Brown) with
zoo.eval.classification_metrics on each side's predictions. Results:
quality_bert_finetune.{jsonl,md} and a curve plot in benchmarks/results/<machine>/.
"""

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from benchmarks import peers, quality_bert, quality_data, step_jobs
from zoo.commands import jobs
from zoo.errors import ConfigError
from zoo.eval import classification_metrics
from zoo.train import init_from, loop, optim, recipe

TASKS = ("spam_assassin", "brown_genre")
METRICS = ("loss", "accuracy", "f1")
# What the validation split is read from, per task (configs/classify.py CORPORA), for the error.
FETCH = {"spam_assassin": "spam_assassin", "brown_genre": "brown"}


@dataclasses.dataclass(frozen=True)
class Recipe:
    pretrain_steps: int = 1500
    steps: int = 600  # fine-tuning: ~4 epochs of SpamAssassin, ~1.8 of Brown's passages at 32
    eval_every: int = 100
    seq_len: int = 128


FULL = Recipe()
QUICK = Recipe(pretrain_steps=60, steps=40, eval_every=20, seq_len=64)


def classify_config(task_name: str, corpus_dir: str, cache_dir: str, vocab: str,
                    pretrained: str, recipe_: Recipe, seed: int) -> ml_collections.ConfigDict:
    """configs/classify.py:corpus=TASK for the pretrained directory, its 'tiny' recipe settled."""
    from configs import classify

    config = classify.get_config(f"size=tiny,corpus={task_name},corpus_dir={corpus_dir}")
    config.data.tokenizer = vocab
    config.data.cache_dir = cache_dir
    config.data.seq_len = recipe_.seq_len
    config.data.seed = seed  # the order of the batches
    config.train.init_from = pretrained
    config.train.steps = recipe_.steps  # optim.total_steps follows (a FieldReference)
    config.train.seed = seed  # the classifier head's init and the dropout masks
    # Tuned for zoo's tiny pretraining (lr 1e-3); 'auto' would pick BERT's real-checkpoint
    # recipe (lr 2e-5) for a Hugging Face directory.
    config.finetune.recipe = "tiny"
    return recipe.resolve(config)


def pretrain(corpus_dir: str, workdir: str, vocab: str, steps: int, seq_len: int,
             log: Callable[[str], None]) -> str:
    """zoo's tiny BERT pretrained on Brown for `steps` steps, as a Hugging Face directory (with
    its vocab.txt) under `workdir`; reused if there."""
    from zoo.convert import hf_save
    from zoo.tasks.mlm_nsp import PretrainingTask

    path = os.path.join(workdir, f"pretrained-{steps}-{seq_len}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    config = quality_bert.bert_config(corpus_dir, os.path.join(workdir, "pretrain_data"), vocab,
                                      steps, seed=0)
    config.data.seq_len = seq_len
    task = PretrainingTask(config, os.path.join(workdir, "pretrain"))
    zoo = quality_bert.ZooBert(config, task)
    batches = task.train_batches(0, 1)
    start = time.perf_counter()
    for i in range(steps):
        loss = zoo.step(next(batches))
        if (i + 1) % max(steps // 5, 1) == 0:
            log(f"  pretrain step {i + 1}/{steps}: loss {loss:.3f} "
                f"({time.perf_counter() - start:.0f} s)")
    log("  pretrained: " + " ".join(f"{k} {v:.4f}" for k, v in
                                     zoo.evaluate(list(task.eval_batches(0, 1))).items()))
    hf_save.save_pretrained(path, task.model_config, jax.device_get(zoo.state.params),
                            task.tokenizer, architecture="BertForPreTraining")
    return path


def scores(labels: np.ndarray, logits: np.ndarray, weights: np.ndarray,
           num_classes: int) -> dict[str, float]:
    """Loss (mean cross-entropy), accuracy and F1 (percent) of the weight-1 rows."""
    keep = weights > 0
    logits, labels = logits[keep].astype(np.float64), labels[keep]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    out = classification_metrics.classification_metrics(labels, logits.argmax(-1), num_classes)
    return {"loss": float(-log_probs[np.arange(len(labels)), labels].mean()),
            "accuracy": out["accuracy"], "f1": out["f1"]}


class ZooClassifier:
    """zoo's classification job: its steps, started from init_from as train.py starts it."""

    name = "zoo"

    def __init__(self, config: ml_collections.ConfigDict, task):
        self.setup = step_jobs.build(config, task)
        self.train_step = loop.make_train_step(self.setup, config)
        self.predict_step = loop.make_predict_step(self.setup)
        self.state = init_from.init_params(config.train.init_from, self.setup.state, "bert",
                                           jobs.load_pretrained_params)
        self.num_classes = len(task.labels)

    def step(self, batch: dict[str, np.ndarray]) -> float:
        with jax.set_mesh(self.setup.mesh):
            self.state, metrics = self.train_step(
                self.state, jax.device_put(batch, self.setup.batch_sharding))
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
        with jax.set_mesh(self.setup.mesh):
            logits = [np.asarray(jax.device_get(self.predict_step(
                self.state.params, jax.device_put(b, self.setup.batch_sharding))["logits"]))
                for b in batches]
        return _scores(batches, logits, self.num_classes)


class HFClassifier:
    """transformers.BertForSequenceClassification from zoo's initial params (the same start)."""

    name = "peer"

    def __init__(self, config: ml_collections.ConfigDict, task, zoo_params):
        import torch
        import transformers

        from zoo.convert import bert as bert_convert

        self.torch = torch
        torch.manual_seed(config.train.seed)
        hf_config = transformers.BertConfig(
            **bert_convert.config_to_hf(task.model_config), num_labels=len(task.labels),
            classifier_dropout=config.finetune.classifier_dropout)
        self.model = transformers.BertForSequenceClassification(hf_config)
        state = bert_convert.params_to_hf(jax.device_get(zoo_params), task.model_config,
                                          heads="sequence_classification")
        self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        self.optimizer = quality_bert.hf_adamw(self.model, config.optim)
        self.schedule = optim.make_schedule(config.optim)
        self.clip_norm = config.optim.clip_norm
        self.num_classes = len(task.labels)
        self.steps = 0

    def _logits(self, b):
        return self.model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                          attention_mask=b["attention_mask"]).logits.float()

    def step(self, batch: dict[str, np.ndarray]) -> float:
        torch = self.torch
        for group in self.optimizer.param_groups:
            group["lr"] = float(self.schedule(self.steps))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        b = peers.to_torch(batch)
        nll = torch.nn.functional.cross_entropy(self._logits(b), b["label"], reduction="none")
        weights = b["example_weight"]
        loss = (nll * weights).sum() / weights.sum().clamp(min=1.0)
        loss.backward()
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()
        self.steps += 1
        return float(loss.item())

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
        self.model.eval()
        with self.torch.no_grad():
            logits = [self._logits(peers.to_torch(b)).numpy() for b in batches]
        return _scores(batches, logits, self.num_classes)


def _scores(batches, logits, num_classes: int) -> dict[str, float]:
    return scores(np.concatenate([b["label"] for b in batches]), np.concatenate(logits),
                  np.concatenate([b["example_weight"] for b in batches]), num_classes)


def run_pair(config: ml_collections.ConfigDict, workdir: str, eval_every: int,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tunes zoo and the peer on the task's batches in turns; per side the curve (step,
    metrics on the whole validation split), final metrics, median seconds per step and the
    parameter count; the number of classes, train and validation examples."""
    from zoo.tasks.classification import ClassificationTask

    task = ClassificationTask(config, workdir)
    eval_batches = task.eval_batches(0, 1)
    zoo = ZooClassifier(config, task)
    sides = [zoo, HFClassifier(config, task, zoo.state.params)]
    out = {s.name: {"curve": [], "step_s": [], "train_loss": []} for s in sides}
    out["zoo"]["params"] = int(sum(x.size for x in jax.tree.leaves(zoo.state.params)))
    out["peer"]["params"] = peers.num_params(sides[1].model)

    def evaluate(step: int):
        for side in sides:
            metrics = side.evaluate(eval_batches)
            out[side.name]["curve"].append((step, metrics))
            log(f"  step {step:4d} {side.name:4s} "
                + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    steps = int(config.train.steps)
    batches = task.train_batches(0, 1)
    evaluate(0)
    for i in range(steps):
        batch = next(batches)
        for side in (sides if i % 2 == 0 else sides[::-1]):
            copy = {k: v.copy() for k, v in batch.items()}
            start = time.perf_counter()
            out[side.name]["train_loss"].append(side.step(copy))
            out[side.name]["step_s"].append(time.perf_counter() - start)
        if (i + 1) % eval_every == 0 or i + 1 == steps:
            evaluate(i + 1)
    for side in sides:
        record = out[side.name]
        record["final"] = record["curve"][-1][1]
        # The first steps compile (zoo) and warm up allocators (both): the median skips them.
        record["step_s"] = float(np.median(record["step_s"][5:] or record["step_s"]))
    out.update(classes=len(task.labels), train_examples=len(task.train_rows["label"]),
               eval_examples=len(task.eval_rows["label"]), majority_accuracy=float(
                   task.baselines()["majority_accuracy"]))
    return out


def write_fixture_corpus(corpus_dir: str) -> str:
    """quality_data's fixture corpus (Brown's text) plus the two labelled sets in the real layout:
    'e-mails' whose spam carries an offer, and passages of three 'genres' that each favour
    their own words; returns `corpus_dir`."""
    quality_data.write_fixture_corpus(corpus_dir)
    os.makedirs(os.path.join(corpus_dir, "spam_assassin"), exist_ok=True)
    offers = ("claim your free prize now", "cheap loans approved today", "win money fast")
    genres = {"news": "the jury said", "romance": "she loved him", "science": "the cell divides"}
    sets = {("spam_assassin", "train.tsv"): 200, ("spam_assassin", "validation.tsv"): 40,
            ("brown", "genre_train.tsv"): 240, ("brown", "genre_validation.tsv"): 60}
    for k, ((corpus, name), count) in enumerate(sets.items()):
        rng = np.random.default_rng(k)
        sentences = quality_data.fixture_sentences(count, 500 + k)
        rows = []
        for i, sentence in enumerate(sentences):
            if corpus == "spam_assassin":
                label = "spam" if rng.random() < 0.35 else "ham"
                text = f"{offers[i % 3]} : {sentence}" if label == "spam" else sentence
            else:
                label = sorted(genres)[i % 3]
                text = f"{sentence} {genres[label]} ."
            rows.append(f"{text}\t{label}\n")
        with open(os.path.join(corpus_dir, corpus, name), "w", encoding="utf-8") as f:
            f.write("text\tlabel\n" + "".join(rows))
    return corpus_dir


def check_corpus(corpus_dir: str, tasks: list[str]) -> None:
    """One error naming the first missing file and the fetch command that writes it."""
    from configs import classify

    needed = [os.path.join(corpus_dir, "brown", "train.txt")]
    for name in tasks:
        corpus, train, validation = classify.CORPORA[name]
        needed += [os.path.join(corpus_dir, corpus, f) for f in (train, validation)]
    for path in needed:
        if not os.path.isfile(path):
            corpus = os.path.basename(os.path.dirname(path))
            raise ConfigError(f"{path} not found: fetch the corpus first with `python -m "
                              f"zoo.commands.corpus fetch {corpus} --out {corpus_dir}`")


def run(corpus_dir: str, tasks: list[str], seeds: list[int], recipe_: Recipe, workdir: str,
        vocab_size: int = 4096, log: Callable[[str], None] = print
        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Pretrains once, then each task's pair for each seed: (header fields, records)."""
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ConfigError(f"--tasks: unknown {unknown}; choose from {TASKS}")
    check_corpus(corpus_dir, tasks)
    texts = [os.path.join(corpus_dir, name, "train.txt") for name in quality_bert.VOCAB_TEXTS]
    vocab = quality_bert.train_wordpiece([t for t in texts if os.path.exists(t)], workdir,
                                         vocab_size)
    log(f"pretraining tiny BERT on Brown: {recipe_.pretrain_steps} steps, vocabulary {vocab}")
    start = time.perf_counter()
    pretrained = pretrain(corpus_dir, workdir, vocab, recipe_.pretrain_steps, recipe_.seq_len,
                          log)
    pretrain_s = time.perf_counter() - start
    records = []
    for name in tasks:
        for seed in seeds:
            config = classify_config(name, corpus_dir, os.path.join(workdir, f"data_{name}"),
                                     vocab, pretrained, recipe_, seed)
            log(f"bert-tiny-{name} seed {seed}: {recipe_.steps} steps from {pretrained}")
            start = time.perf_counter()
            out = run_pair(config, os.path.join(workdir, f"{name}_seed{seed}"),
                           recipe_.eval_every, log)
            records.append({"pair": f"bert-tiny-{name}", "task": name, "seed": seed,
                            "steps": recipe_.steps, "wall_s": time.perf_counter() - start,
                            **{k: out[k] for k in ("classes", "train_examples", "eval_examples",
                                                   "majority_accuracy")},
                            "sides": {k: out[k] for k in ("zoo", "peer")}})
    header = {"recipe": dataclasses.asdict(recipe_), "vocab_size": vocab_size,
              "pretrain_s": pretrain_s, "tasks": tasks}
    return header, records


def main(argv=None) -> int:
    """python -m benchmarks.quality_bert_finetune --corpus DIR [--tasks ...] [--seeds 0,1]"""
    import argparse
    import datetime
    import sys
    import tempfile

    from benchmarks import machine, quality_bert_finetune_report
    from zoo import errors

    parser = argparse.ArgumentParser(description="tiny BERT fine-tuning beside HF's")
    parser.add_argument("--corpus", default="", help="what `zoo.commands.corpus fetch` wrote "
                        "(brown, spam_assassin); --quick without it: a fixture corpus")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"of {TASKS}")
    parser.add_argument("--seeds", default="", help="default 0,1 (--quick: 0)")
    parser.add_argument("--quick", action="store_true", help="a few steps, one seed unless "
                        "--seeds, on a fixture corpus unless --corpus: a smoke run")
    parser.add_argument("--workdir", default="", help="prepared data and the pretrained model; "
                        "default a temporary directory")
    parser.add_argument("--out", default="", help="default benchmarks/results/<machine> "
                        "(--quick: a temporary directory)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP
    corpus = args.corpus
    if args.quick and not corpus:
        corpus = write_fixture_corpus(tempfile.mkdtemp(prefix="quality_bert_finetune_corpus_"))
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    try:
        if not corpus:
            raise ConfigError("--corpus DIR is required (or --quick for a fixture corpus)")
        torch_info = peers.setup_torch("cpu")
        started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
        header, records = run(
            corpus, [t for t in args.tasks.split(",") if t], seeds, QUICK if args.quick else FULL,
            args.workdir or tempfile.mkdtemp(prefix="quality_bert_finetune_"),
            log=lambda line: print(line, flush=True))
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    header.update(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, torch=torch_info["torch"],
                  transformers=torch_info["transformers"], corpus=corpus,
                  mode="quick" if args.quick else "full",
                  started=started.strftime("%Y-%m-%d %H:%M UTC"),
                  wall_s=time.perf_counter() - start)
    out = args.out or (tempfile.mkdtemp(prefix="quality_bert_finetune_out_") if args.quick
                       else "")
    paths = quality_bert_finetune_report.write(machine.results_dir(out or None), header, records)
    print("wrote " + ", ".join(paths), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
