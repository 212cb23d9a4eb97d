"""word2vec (CBOW / skip-gram with negative sampling) on a text corpus; the kept `embedding`
table is the product (the lecture notes from NNLM to BERT: the context table is discarded),
queried and exported by
`python -m zoo.commands.word2vec_query`.

Eval reports the negative-sampling loss on held-out pairs (drawn from the validation split as
training draws its pairs) and, on the synthetic world, a neighbour purity: for each entity word
in the vocabulary (the names of persons, cities, countries, languages and companies; the types
of config.eval.purity_types), the share of its purity_k nearest entity words (cosine, on the
`embedding` table) that have its type, averaged per type and then over types so the 340-odd
persons do not outweigh the 25 countries. `baselines()` gives the same figure for random
vectors (about 1/number-of-types), which trained vectors should beat by far: the synthetic
world puts entities of one type only in the same template slots.

Purity needs the embedding table, which only `predict` sees: the eval rows carry one probe word
id each (the entity words first, then 0-weight padding), `predict` returns their embedding rows,
and `score_predictions` computes purity from them on the host.
"""

import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from zoo.data.pipelines import batching
from zoo.data.readers import data_source, sources
from zoo.data.readers import word2vec as w2v_data
from zoo.data.synthetic.world import ENTITY_TYPES, make_world
from zoo.errors import ConfigError
from zoo.models import word2vec as w2v
from zoo.tasks.base import Baselines, Batch, Measured, Predicting, Sampling, Scored, Task


def neighbour_purity(vectors: np.ndarray, labels: np.ndarray, k: int) -> dict[str, float]:
    """Share of each vector's k cosine-nearest others (among `vectors` [N, D]) whose label
    equals its own: 'macro' averages per label first, 'micro' over all N vectors."""
    labels = np.asarray(labels)
    n = len(labels)
    if n < 2 or k < 1:
        raise ConfigError(f"neighbour_purity needs >= 2 vectors and k >= 1, got {n} and k={k}")
    k = min(k, n - 1)
    v = np.asarray(vectors, np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    sims = v @ v.T  # (N, N)
    np.fill_diagonal(sims, -np.inf)  # a word is not its own neighbour
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]  # (N, k)
    same = (labels[top] == labels[:, None]).mean(axis=1)  # (N,)
    macro = np.mean([same[labels == t].mean() for t in np.unique(labels)])
    return {"macro": float(macro), "micro": float(same.mean())}


class Word2VecTask(Task, Predicting, Sampling, Baselines, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        if data.negatives < 1:
            raise ConfigError(f"config.data.negatives={data.negatives} must be >= 1 (noise words "
                              "per example; the C tool's default is 5)")
        train_sentences = [w2v_data.tokenize(s) for doc in sources.load_documents(data, "train")
                           for s in doc]
        eval_sentences = [w2v_data.tokenize(s) for doc in
                          sources.load_documents(data, "validation") for s in doc]
        self.vocab = w2v_data.build_vocabulary(train_sentences, data.min_count)
        mode = config.model.mode
        rows = dict(vocab=self.vocab, mode=mode, window=data.window, sample=data.sample,
                    seed=data.seed)
        self.train_rows = w2v_data.training_rows(
            [self.vocab.encode(s) for s in train_sentences], draws=data.pair_draws, stream=0,
            **rows)
        eval_rows = w2v_data.training_rows(
            [self.vocab.encode(s) for s in eval_sentences], draws=1, stream=1, **rows)
        # Uniform draws searched in this table give the negatives (in the device step).
        self.noise_cdf = w2v_data.noise_cdf(self.vocab.counts, data.noise_power)
        self.probe_ids, self.probe_types = self._probes()
        # Without two entity words (e.g. a text corpus) there is no purity: the probe column
        # weighs 0 throughout and score_predictions reports nothing.
        self.eval_rows = self._with_probes(eval_rows)
        self.sample_ids = self._sample_ids()
        model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
        self.model_config = w2v.config_for_size(config.model.size,
                                                vocab_size=len(self.vocab), **model_kw)
        self.model = w2v.Word2Vec(self.model_config)

    # ---- data ----------------------------------------------------------------------------

    def _probes(self) -> tuple[np.ndarray, np.ndarray]:
        """Vocabulary ids of the synthetic world's entity words and their type indices."""
        data = self.config.data
        if data_source.source_of(data) != data_source.SYNTHETIC:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        types = tuple(self.config.eval.purity_types)
        unknown = [t for t in types if t not in ENTITY_TYPES]
        if unknown:
            raise ConfigError(f"config.eval.purity_types has {unknown}; choose from "
                              f"{ENTITY_TYPES}")
        world = make_world(data.seed, data.synthetic_entities)
        ids, labels = [], []
        for label, type_ in enumerate(types):
            for entity in world.of_type(type_):
                word = entity.name.lower()
                if word in self.vocab:
                    ids.append(self.vocab.id(word))
                    labels.append(label)
        return np.asarray(ids, np.int32), np.asarray(labels, np.int32)

    def _sample_ids(self) -> list[int]:
        """Ids of config.sample.words, checked now rather than after training; '' = the first
        entity word of each purity type (none without the synthetic world)."""
        words = [w.strip() for w in self.config.sample.words.split(",") if w.strip()]
        if not words:
            return [int(self.probe_ids[np.argmax(self.probe_types == t)])
                    for t in np.unique(self.probe_types)]
        try:
            return [self.vocab.id(w) for w in words]
        except KeyError as e:
            raise ConfigError(f"config.sample.words: {e.args[0]}") from None

    def _with_probes(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Eval rows with a probe column: row i probes entity word i, the rest weigh 0."""
        n = max(len(rows["targets"]), len(self.probe_ids))
        pad = n - len(rows["targets"])
        rows = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                for k, v in rows.items()}
        rows["probe"] = np.zeros(n, np.int32)
        rows["probe"][:len(self.probe_ids)] = self.probe_ids
        rows["probe_weights"] = np.zeros(n, np.float32)
        rows["probe_weights"][:len(self.probe_ids)] = 1.0
        return rows

    def train_batches(self, process_index: int, process_count: int):
        """Endless shuffled epochs of `train_rows`, each epoch's order one numpy permutation
        (zoo.data.pipelines.batching.bucketed_train_iterator with one bucket, every row's
        width). The base class's grain shuffle places one row at a time, ~18 us a row: on the
        English text's 44.6M skip-gram rows a batch of 1,024 took 18 ms, 2.5x the train step
        itself (7 ms on 2 CPU cores), while this takes 0.3 ms a batch after 5-9 s permuting the
        epoch."""
        width = self.train_rows["inputs"].shape[1]
        n = len(self.train_rows["targets"])
        if n < self.config.data.batch_size:
            raise ConfigError(f"config.data.batch_size={self.config.data.batch_size} exceeds the "
                              f"{n:,} training rows; lower it or add text")
        return batching.bucketed_train_iterator(
            self.train_rows, np.full(n, width), [width], self.config.data.batch_size,
            self.config.data.seed, process_index, process_count)

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        outputs = np.zeros((len(batch["targets"]), 1 + self.config.data.negatives), np.int32)
        return dict(inputs=batch["inputs"], input_weights=batch["input_weights"], outputs=outputs)

    # ---- loss and metrics ----------------------------------------------------------------

    def loss_fn(self, params, batch, rng, train: bool):
        targets = batch["targets"]  # (B,)
        negatives = w2v.sample_negatives(rng, jnp.asarray(self.noise_cdf),
                                         (targets.shape[0], self.config.data.negatives))
        outputs = jnp.concatenate([targets[:, None], negatives], axis=1)  # (B, 1 + K)
        # A noise word that is the true output is skipped, as in the C tool.
        output_weights = (outputs != targets[:, None]).at[:, 0].set(True)
        scores = self.model.apply({"params": params}, batch["inputs"], batch["input_weights"],
                                  outputs)  # (B, 1 + K)
        weights = batch["weights"].astype(jnp.float32)
        loss = w2v.negative_sampling_loss(scores, output_weights)
        # The true output scored above every (kept) noise word.
        beaten = jnp.where(output_weights[:, 1:], scores[:, 1:], -jnp.inf)
        correct = (scores[:, 0] > beaten.max(axis=1)).astype(jnp.float32)
        return {"loss_sum": (loss * weights).sum(), "correct_sum": (correct * weights).sum(),
                "weight_sum": weights.sum()}

    def summarize(self, sums):
        n = max(sums["weight_sum"], 1.0)
        return {"loss": sums["loss_sum"] / n, "accuracy": sums["correct_sum"] / n}

    def predict(self, params, batch):
        vectors = self.model.apply({"params": params}, batch["probe"], method="embed")
        return {"vectors": vectors, "probe_weights": batch["probe_weights"]}

    def _has_purity(self) -> bool:
        return len(self.probe_ids) >= 2

    def score_predictions(self, outputs: dict[str, np.ndarray]) -> Scored:
        if not self._has_purity():
            return Scored({})
        vectors = outputs["vectors"][outputs["probe_weights"] > 0]  # the probes, in order
        purity = neighbour_purity(vectors, self.probe_types, self.config.eval.purity_k)
        return Scored({"neighbour_purity": purity["macro"],
                       "neighbour_purity_micro": purity["micro"]})

    def baselines(self) -> dict[str, float]:
        """Neighbour purity of random Gaussian vectors for the same words (mean of 5 draws)."""
        if not self._has_purity():
            return {}
        rng = np.random.default_rng(self.config.data.seed)
        draws = [neighbour_purity(rng.standard_normal((len(self.probe_ids),
                                                       self.model_config.embed_dim)),
                                  self.probe_types, self.config.eval.purity_k)
                 for _ in range(5)]
        return {"random_neighbour_purity": float(np.mean([d["macro"] for d in draws])),
                "random_neighbour_purity_micro": float(np.mean([d["micro"] for d in draws]))}

    def samples(self, params) -> list[str]:
        """Nearest neighbours of config.sample.words over the whole vocabulary:
        'word: n1 n2 ...' (config.sample.num_neighbours of them; 0 = no samples)."""
        k = self.config.sample.num_neighbours
        if k <= 0 or not self.sample_ids:
            return []
        table = np.asarray(multihost_utils.process_allgather(params["embedding"], tiled=True))
        lines = []
        for i in self.sample_ids:
            near, _ = w2v.cosine_neighbours(table, table[i], k, exclude=[i])
            lines.append(f"{self.vocab.words[i]}: " + " ".join(self.vocab.words[j] for j in near))
        return lines

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size  # examples (pairs / windows) per step

    def flops_per_token(self) -> float:
        """Per example: the input average (2 C D) and 1 + K dot products (2 D each) forward,
        x3 with the backward pass."""
        d = self.model_config.embed_dim
        c = self.train_rows["inputs"].shape[1]
        return 3.0 * (2 * c * d + 2 * d * (1 + self.config.data.negatives))
