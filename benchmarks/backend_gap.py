"""Is zoo slower than PyTorch on a CPU because of zoo's code or because of XLA:CPU? (issue 37's
speed goal, issue 39's "step / forward").

    python -m benchmarks.backend_gap            # tiny and mini BERT classifiers, ~3 min
    python -m benchmarks.backend_gap --sizes tiny --repeats 20

The same BERT sequence classifier (no dropout, batch 32, sequence 128, a quarter of each row
padding) three ways: zoo's `BertForSequenceClassification`; a minimal BERT written here in
plain jax.numpy (one fused QKV matmul, no logical axis constraints, no zoo module); and Hugging
Face's PyTorch `BertForSequenceClassification`. Forward and loss-gradient times are medians of
calls taken in turns (zoo, minimal, HF; then reversed), so a load falls on all three alike.
tests/benchmarks/test_backend_gap.py checks the minimal BERT and zoo's compile to the same
FLOPs (XLA's cost analysis), so the two JAX columns do the same work.

Reading it: zoo's column against the minimal one is zoo's own overhead; the minimal one against
HF's is XLA:CPU's code against PyTorch's kernels. Results:
benchmarks/results/<machine>/backend_gap.{jsonl,md}.
"""

import argparse
import datetime
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine, peers
from zoo import errors
from zoo.models import bert

# name -> (layers, heads, width, vocabulary); FFN 4 x width; BERT's tiny (zoo's test size) and
# mini (google-research/bert's smallest release).
SIZES = {"tiny": (2, 2, 64, 4096), "mini": (4, 4, 256, 8192)}
BATCH, SEQ = 32, 128


def inputs(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((BATCH, SEQ), np.int32)
    mask[:, SEQ * 3 // 4:] = 0
    return {"ids": rng.integers(5, vocab, (BATCH, SEQ)).astype(np.int32),
            "types": np.zeros((BATCH, SEQ), np.int32), "mask": mask,
            "labels": rng.integers(0, 2, BATCH).astype(np.int32)}


def minimal_params(key, layers: int, width: int, vocab: int) -> dict:
    keys = iter(jax.random.split(key, 8 + 8 * layers))

    def n(*shape):
        return 0.02 * jax.random.normal(next(keys), shape)

    def norm():
        return jnp.ones(width), jnp.zeros(width)

    ffn = 4 * width
    return {"word": n(vocab, width), "pos": n(512, width), "type": n(2, width), "ln": norm(),
            "pool": (n(width, width), jnp.zeros(width)), "cls": (n(width, 2), jnp.zeros(2)),
            "layers": [{"qkv": (n(width, 3 * width), jnp.zeros(3 * width)),
                        "out": (n(width, width), jnp.zeros(width)), "ln1": norm(),
                        "up": (n(width, ffn), jnp.zeros(ffn)),
                        "down": (n(ffn, width), jnp.zeros(width)), "ln2": norm()}
                       for _ in range(layers)]}


def _layer_norm(x, scale_bias):
    scale, bias = scale_bias
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-12) * scale + bias


def minimal_logits(params, ids, types, mask, heads: int):
    """Post-LN BERT encoder, pooler and classifier in plain jax.numpy."""
    batch, seq = ids.shape
    width = params["word"].shape[1]
    x = params["word"][ids] + params["pos"][:seq][None] + params["type"][types]
    x = _layer_norm(x, params["ln"])
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, -1e9)
    head = width // heads
    for layer in params["layers"]:
        qkv = (x @ layer["qkv"][0] + layer["qkv"][1]).reshape(batch, seq, 3, heads, head)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head) + bias
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
        x = _layer_norm(x + attended.reshape(batch, seq, width) @ layer["out"][0]
                        + layer["out"][1], layer["ln1"])
        hidden = jax.nn.gelu(x @ layer["up"][0] + layer["up"][1], approximate=False)
        x = _layer_norm(x + hidden @ layer["down"][0] + layer["down"][1], layer["ln2"])
    pooled = jnp.tanh(x[:, 0] @ params["pool"][0] + params["pool"][1])
    return pooled @ params["cls"][0] + params["cls"][1]


def _cross_entropy(logits, labels):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1).sum()


def jax_sides(size: str, batch: dict) -> dict:
    """{'zoo': (forward, gradient, params), 'minimal': (...)}: jitted functions of params."""
    layers, heads, width, vocab = SIZES[size]
    ids, types, mask, labels = (jnp.asarray(batch[k]) for k in ("ids", "types", "mask",
                                                                  "labels"))
    config = bert.BertConfig(vocab_size=vocab, hidden_size=width, num_layers=layers,
                             num_heads=heads, intermediate_size=4 * width, dropout_rate=0.0,
                             attention_dropout_rate=0.0)
    model = bert.BertForSequenceClassification(config, num_labels=2)
    zoo_params = model.init(jax.random.key(0), ids, types, mask)["params"]

    def zoo_logits(p):
        return model.apply({"params": p}, ids, types, mask)

    def mini_logits(p):
        return minimal_logits(p, ids, types, mask, heads)

    return {name: (jax.jit(f), jax.jit(jax.grad(lambda p, f=f: _cross_entropy(f(p), labels))),
                   params)
            for name, f, params in (("zoo", zoo_logits, zoo_params),
                                    ("minimal", mini_logits,
                                     minimal_params(jax.random.key(0), layers, width, vocab)))}


def hf_side(size: str, batch: dict):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    layers, heads, width, vocab = SIZES[size]
    model = BertForSequenceClassification(BertConfig(
        vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * width, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=2))
    ids, types, mask, labels = (torch.from_numpy(batch[k].astype(np.int64))
                                for k in ("ids", "types", "mask", "labels"))

    def forward():
        with torch.no_grad():
            model(input_ids=ids, token_type_ids=types, attention_mask=mask)

    def gradient():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        torch.nn.functional.cross_entropy(logits, labels, reduction="sum").backward()

    return forward, gradient


def in_turns(calls: dict, repeats: int) -> dict[str, float]:
    """Median ms of each call, taken in turns (forward order, then reversed), after 3 warm-ups."""
    times = {name: [] for name in calls}
    for i in range(repeats + 3):
        for name in (list(calls) if i % 2 == 0 else list(calls)[::-1]):
            start = time.perf_counter()
            calls[name]()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def measure(size: str, repeats: int) -> dict:
    batch = inputs(SIZES[size][3])
    sides = jax_sides(size, batch)
    hf_forward, hf_gradient = hf_side(size, batch)
    forward = {name: (lambda f=f, p=p: jax.block_until_ready(f(p)))
               for name, (f, _, p) in sides.items()}
    gradient = {name: (lambda g=g, p=p: jax.block_until_ready(g(p)))
                for name, (_, g, p) in sides.items()}
    record = {"size": size, "layers_heads_width_vocab": SIZES[size], "batch": BATCH, "seq": SEQ,
              "forward_ms": in_turns(dict(forward, hf=hf_forward), repeats),
              "gradient_ms": in_turns(dict(gradient, hf=hf_gradient), repeats),
              "load": os.getloadavg()[0]}
    return record


def write(directory: str, header: dict, records: list[dict]) -> list[str]:
    jsonl = os.path.join(directory, "backend_gap.jsonl")
    with open(jsonl, "w") as f:
        for line in [header] + records:
            f.write(json.dumps(line) + "\n")
    rows = ["| size | pass | zoo ms | minimal JAX ms | HF PyTorch ms | zoo / minimal | "
            "minimal / HF |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in records:
        for name in ("forward", "gradient"):
            t = r[f"{name}_ms"]
            rows.append(f"| {r['size']} | {name} | {t['zoo']:.1f} | {t['minimal']:.1f} | "
                        f"{t['hf']:.1f} | {t['zoo'] / t['minimal']:.2f} | "
                        f"{t['minimal'] / t['hf']:.2f} |")
    loads = ", ".join(f"{r['load']:.1f}" for r in records)
    md = os.path.join(directory, "backend_gap.md")
    with open(md, "w") as f:
        f.write(f"# zoo, a minimal JAX BERT and Hugging Face's PyTorch BERT on "
                f"{header['machine']}\n\n`python -m benchmarks.backend_gap` at zoo "
                f"{header['zoo_commit']}, jax {header['jax']}, torch {header['torch']}, "
                f"{header['threads']} torch threads; {header['started']}; 1-minute load "
                f"{loads} (the sizes in turn).\n\n"
                "Batch 32 x 128, a quarter of each row padding, no dropout; medians of calls "
                "taken in turns. zoo / minimal is zoo's own overhead; minimal / HF is "
                "XLA:CPU's code against PyTorch's kernels (benchmarks/backend_gap.py).\n\n"
                + "\n".join(rows) + "\n")
    return [jsonl, md]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,mini", help=f"comma-separated of {list(SIZES)}")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine>")
    args = parser.parse_args(argv)
    try:
        sizes = [s for s in args.sizes.split(",") if s]
        if set(sizes) - set(SIZES) or args.repeats < 1:
            raise errors.ConfigError(f"--sizes {args.sizes!r} must name sizes of {list(SIZES)}"
                                     f" and --repeats {args.repeats} be >= 1")
        reason = peers.unavailable_reason(jax.devices()[0].platform)
        if reason:
            raise errors.ConfigError(f"benchmarks.backend_gap needs PyTorch: {reason}")
        torch_info = peers.setup_torch("cpu")
        header = dict(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                      jax=jax.__version__, torch=torch_info["torch"],
                      threads=torch_info["torch_threads"],
                      started=datetime.datetime.now(datetime.timezone.utc).strftime(
                          "%Y-%m-%d %H:%M UTC"))
        records = []
        for size in sizes:
            records.append(measure(size, args.repeats))
            print(json.dumps(records[-1]), flush=True)
        paths = write(machine.results_dir(args.out or None), header, records)
        print("wrote " + ", ".join(paths))
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
