"""ELMo's biLM (zoo.models.elmo) trained on a text corpus: the forward and backward LSTM LMs
jointly, their negative log-likelihoods summed.

Data: the documents of config.data.source (zoo.data.readers.sources), tokenised into words as
word2vec's (zoo.data.readers.word2vec.tokenize: lower-cased, punctuation dropped). Every sentence
is wrapped as <s> w_1 .. w_n </s> and a document's sentences are packed, whole and in order, into
rows of at most config.data.seq_len tokens (a sentence longer than a row keeps its first
seq_len - 2 words), so the LMs read sentences in context as bilm-tf's sentence stream does.
The vocabulary is zoo.models.elmo.SPECIALS (<pad> <unk> <s> </s>) followed by the training
split's words seen at least config.data.min_count times, most frequent first; other words read
as <unk>. It is rebuilt, identically, from the corpus and those two settings (`load_documents`
+ `build_vocabulary`), which is how a downstream task (zoo.tasks.feature_classification) gets
this biLM's ids; `text_row` encodes such a task's text the way training rows read.

Loss: the forward NLL of every token after the row's first plus the backward NLL of every token
before its last, token sums; the boundary predictions that are certain (the forward LM's <s>
after a </s>, the backward LM's </s> before a <s>) are left out, so both directions score the
same number of tokens. Eval reports the sum of the two mean NLLs as `loss`, each direction's
perplexity, and `perplexity`, the mean of the two (the figure the ELMo paper quotes);
`baselines()` gives an add-one unigram model's perplexity on the forward targets.

The params live under 'bilm' (`init_params`), the subtree a downstream task restores with
config.train.init_from.
"""

import math
import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines import lm_pipeline
from zoo.data.readers import sources
from zoo.data.readers import word2vec as w2v_data
from zoo.errors import ConfigError
from zoo.models import elmo
from zoo.models.elmo import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from zoo.tasks.base import Baselines, Batch, Measured, Task

# A sentence ends at . ! or ? followed by white space (enough for the synthetic world's text and
# for splitting a user's premise; corpora come already split into sentences).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

Document = list[list[str]]  # sentences of word tokens


def load_documents(data: ml_collections.ConfigDict, split: str) -> list[Document]:
    """The word tokens of every non-empty sentence of `split` of config.data's corpus, by
    document."""
    documents = []
    for doc in sources.load_documents(data, split):
        sentences = [t for t in (w2v_data.tokenize(s) for s in doc) if t]
        if sentences:
            documents.append(sentences)
    return documents


def build_vocabulary(documents: list[Document], min_count: int) -> w2v_data.Vocabulary:
    """SPECIALS (ids 0-3, count 0) then the words seen at least `min_count` times."""
    words = w2v_data.build_vocabulary((s for doc in documents for s in doc), min_count)
    counts = np.concatenate([np.zeros(len(SPECIALS), np.int64), words.counts])
    return w2v_data.Vocabulary(SPECIALS + words.words, counts, min_count)


def encode_words(vocab: w2v_data.Vocabulary, tokens: list[str]) -> list[int]:
    """Ids of `tokens`, <unk> for words outside the vocabulary."""
    return [vocab.id(t) if t in vocab else UNK_ID for t in tokens]


def pack_document(vocab: w2v_data.Vocabulary, document: Document, seq_len: int
                  ) -> tuple[list[list[int]], int]:
    """A document's rows of whole wrapped sentences, each row at most seq_len ids; returns
    (rows, number of sentences cut to seq_len - 2 words)."""
    rows, row, cut = [], [], 0
    for tokens in document:
        words = encode_words(vocab, tokens)
        cut += len(words) > seq_len - 2
        sentence = [BOS_ID] + words[:seq_len - 2] + [EOS_ID]
        if row and len(row) + len(sentence) > seq_len:
            rows.append(row)
            row = []
        row = row + sentence
    return rows + [row] if row else rows, cut


def pad_rows(rows: list[list[int]], width: int) -> dict[str, np.ndarray]:
    """{'ids' int32 [N, width] (<pad> after each row), 'lengths' int32 [N]}."""
    ids = np.full((len(rows), width), PAD_ID, np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        lengths[i] = len(row)
    return {"ids": ids, "lengths": lengths}


def document_rows(vocab: w2v_data.Vocabulary, documents: list[Document], seq_len: int
                  ) -> dict[str, np.ndarray]:
    """Training rows of `documents` (pack_document): pad_rows plus 'weights' float32 [N] (1;
    eval padding adds 0-weight rows)."""
    if seq_len < 3:
        raise ConfigError(f"config.data.seq_len={seq_len} must be >= 3 (<s>, a word and </s>)")
    rows, cut = [], 0
    for document in documents:
        packed, n = pack_document(vocab, document, seq_len)
        rows += packed
        cut += n
    if cut and jax.process_index() == 0:
        print(f"note: {cut} sentences have more than {seq_len - 2} words and were cut "
              f"(config.data.seq_len={seq_len})", file=sys.stderr, flush=True)
    out = pad_rows(rows, seq_len)
    out["weights"] = np.ones(len(rows), np.float32)
    return out


def text_row(vocab: w2v_data.Vocabulary, text: str, max_words: int) -> list[int]:
    """A downstream text as the biLM reads it: split into sentences, each <s> .. </s>, keeping
    the first `max_words` words in all."""
    row, left = [], max_words
    for sentence in _SENTENCE_END.split(text.strip()):
        words = encode_words(vocab, w2v_data.tokenize(sentence))[:left]
        if words:
            row += [BOS_ID] + words + [EOS_ID]
            left -= len(words)
    return row


def direction_weights(ids, lengths, weights, xp=jnp):
    """Which predictions count, [B, T - 1] float32 each for (forward, backward): forward
    logits[:, t - 1] score ids[:, t], backward logits[:, t] score ids[:, t - 1], for
    t = 1 .. length - 1, leaving out the certain boundaries (forward: a <s>; backward: a </s>).
    `xp` is jnp in the step, np on the host."""
    t = xp.arange(1, ids.shape[1])  # the later position of each (t - 1, t) pair
    real = (t[None, :] < lengths[:, None]) & (weights[:, None] > 0)
    forward = real & (ids[:, 1:] != BOS_ID)
    backward = real & (ids[:, :-1] != EOS_ID)
    return forward.astype(xp.float32), backward.astype(xp.float32)


class BiLMTask(Task, Baselines, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        train_documents = load_documents(data, "train")
        self.vocab = build_vocabulary(train_documents, data.min_count)
        self.train_rows = document_rows(self.vocab, train_documents, data.seq_len)
        self.eval_rows = document_rows(self.vocab, load_documents(data, "validation"),
                                       data.seq_len)
        model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
        self.model_config = elmo.config_for_size(config.model.size, vocab_size=len(self.vocab),
                                                 **model_kw)
        self.model = elmo.BiLM(self.model_config)

    def init_params(self, rng: jax.Array):
        # Under 'bilm', the name a downstream model gives its frozen biLM (pretrained_subtree).
        batch = self.init_batch()
        variables = self.model.init({"params": rng, "dropout": rng}, batch["ids"],
                                    batch["lengths"])
        return {"bilm": variables["params"]}

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def loss_fn(self, params, batch, rng, train: bool):
        rngs = {"dropout": rng} if train else {}
        fwd, bwd = self.model.apply({"params": params["bilm"]}, batch["ids"], batch["lengths"],
                                    deterministic=not train, rngs=rngs)  # (B, T, V) each
        ids = batch["ids"]
        w_f, w_b = direction_weights(ids, batch["lengths"], batch["weights"])
        f = cross_entropy_sums(fwd[:, :-1], ids[:, 1:], w_f)
        b = cross_entropy_sums(bwd[:, 1:], ids[:, :-1], w_b)
        # weight_sum counts one direction's tokens (both score as many), so loss is the sum
        # of the two mean NLLs.
        return {"loss_sum": f["loss_sum"] + b["loss_sum"], "weight_sum": f["weight_sum"],
                "backward_weight_sum": b["weight_sum"],
                "forward_nll_sum": f["nll_sum"], "backward_nll_sum": b["nll_sum"],
                "correct_sum": f["correct_sum"] + b["correct_sum"]}

    def summarize(self, sums):
        n = max(sums["weight_sum"], 1.0)
        forward = math.exp(min(sums["forward_nll_sum"] / n, 50.0))
        backward = math.exp(min(sums["backward_nll_sum"] / max(sums["backward_weight_sum"], 1.0),
                                50.0))
        return {"loss": sums["loss_sum"] / n, "accuracy": sums["correct_sum"] / (2 * n),
                "forward_perplexity": forward, "backward_perplexity": backward,
                "perplexity": (forward + backward) / 2, "tokens": sums["weight_sum"]}

    def baselines(self) -> dict[str, float]:
        """Perplexity of an add-one unigram model fit on the training split's forward targets,
        scored on the eval split's (the backward targets hold <s> where these hold </s>)."""

        def targets(rows):
            w_f, _ = direction_weights(rows["ids"], rows["lengths"], rows["weights"], xp=np)
            return {"targets": rows["ids"][:, 1:][w_f > 0], "weights": np.ones(int(w_f.sum()))}

        nll = lm_pipeline.unigram_nll_per_token(targets(self.train_rows),
                                                targets(self.eval_rows), len(self.vocab))
        return {"unigram_perplexity": math.exp(nll)}

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size * self.config.data.seq_len

    def flops_per_token(self) -> float:
        return elmo.flops_per_token(self.model_config)
