"""Fine-tune a pretrained GPT on classification (GPT's second stage, Radford et al. 2018 s3.3).

Pretrain, then fine-tune from that run (its checkpoint fills the GPT; its tokenizer, cached in
A/data, is found there):

    python train.py --config=configs/gpt.py:size=tiny --workdir=A
    python train.py --config=configs/gpt_classify.py:size=tiny,task=fact_check --workdir=B \\
        --config.train.init_from=A
    python eval.py  --config=configs/gpt_classify.py:size=tiny,task=fact_check --workdir=B \\
        --config.train.init_from=A

eval.py needs the same init_from: it names the tokenizer and the GPT's shape. If run A set
--config.data.cache_dir=C, its tokenizer is in C: add --config.data.tokenizer=C/spm-bpe-1024.model
(the vocabulary must be the checkpoint's; a mismatch is an error naming both sizes). The
fine-tuning config.model.size must be the pretraining one, and config.data.seq_len at most its
positions (configs/gpt.py:size=tiny trains 64).

A Hugging Face GPT-2 directory (config.json + model.safetensors, vocab.json + merges.txt) works
the same way: --config.train.init_from=gpt2/ defines the model and the tokenizer.

Variants: size = tiny | 124M | 355M | 774M; task = fact_check (synthetic sentence pairs:
entailment / contradiction / neutral, [start] premise [delim] claim [extract]) | relation
(synthetic single sentences, 19 relations, [start] sentence [extract]) | multiple_choice
(synthetic: which of a premise's 3 fact_check claims, entailed / contradicting / neutral, it
entails; one [start] premise [delim] claim [extract] row per option, a softmax over them). fact_check and relation are the very
splits configs/classify.py gives BERT, so the accuracies compare.

Objective: class cross-entropy + lambda * the language-modelling loss of the same inputs,
lambda = --config.finetune.lm_weight (0.5, the paper's; 0 turns the auxiliary loss off).

Your own data: --config.data.source=files --config.data.train_file=train.tsv
--config.data.eval_file=dev.tsv (GLUE TSV with a header, or .jsonl; columns as configs/classify.py
describes); multiple choice: --config.data.choices=option0,option1,... (TSV columns, or one JSONL
key holding the list of options) with text_a naming the context.
"""

import ml_collections

from configs import common
from zoo.train.optim import default_optim_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_arg(arg, size="tiny", task="fact_check")
    tiny = variant.size == "tiny"
    config = ml_collections.ConfigDict()
    config.task = "gpt_classify"
    config.model = dict(
        size=variant.size,
        max_len=0,  # from scratch only: positions (0 = config.data.seq_len); else the checkpoint's
        dropout_rate=0.0 if tiny else 0.1, attention_dropout_rate=0.0 if tiny else 0.1,
        **common.runtime_model_config(tiny),
    )
    config.finetune = dict(
        lm_weight=0.5,  # lambda of the auxiliary language-modelling loss; 0 = off
        classifier_dropout=0.1,
    )
    config.data = dict(
        source="synthetic",  # synthetic | files
        synthetic_task=variant.task,  # fact_check | relation | multiple_choice
        seed=0,
        synthetic_entities=2000,
        train_file="",  # files source: GLUE-style .tsv (header row) or .jsonl
        eval_file="",
        text_a="",  # column / key of the first text (multiple choice: the context)
        text_b="",  # second text; '' = auto-detect, 'none' = single sentence
        choices="",  # multiple choice: option columns 'a,b,c' (TSV) or one list-valued key
        label="label",
        labels="",  # comma-separated label list (fixes the order); '' = sorted train labels
        tokenizer="",  # '' = init_from's (A/data/*.model, GPT-2's vocab.json), else trained
        tokenizer_type="bpe",
        vocab_size=1024 if tiny else 32768,  # only for a tokenizer trained here (no init_from)
        cache_dir="",  # '' = <workdir>/data
        seq_len=64 if tiny else 512,
        batch_size=32,
        eval_batch_size=64,
    )
    # The paper fine-tunes with lr 6.25e-5, batch 32, linear decay after 0.2% warmup, 3 epochs.
    steps = ml_collections.FieldReference(1000 if tiny else 3000)
    config.optim = default_optim_config()
    config.optim.update(name="adamw", learning_rate=1e-3 if tiny else 6.25e-5,
                        warmup_steps=100 if tiny else 30, decay="linear", b1=0.9, b2=0.999,
                        eps=1e-8, weight_decay=0.01, clip_norm=1.0)
    config.optim.total_steps = steps
    config.train = common.train_config(steps)
    config.train.update(eval_every=250, checkpoint_every=500, log_every=50,
                        best_metric="accuracy", best_mode="max")
    config.mesh = common.mesh_config()
    return config
