"""Writes tests/convert/fixtures/google_bert_tiny/: a google-research/bert directory written by
real TensorFlow, and what the reader and zoo.convert.hf.load_pretrained must get out of it.

Run once, by hand; the output is committed (about 50 KB) and the tests need no TensorFlow:

  python -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu numpy
  cd /work/main && python tests/convert/make_google_bert_fixture.py [--tf-python PATH]

This script runs in the project's environment (torch + transformers); TensorFlow runs only in
the throwaway venv, in a subprocess that writes the checkpoints with tf.compat.v1.train.Saver
in graph mode, as google-research/bert's run_pretraining.py does.

The directory:
  bert_config.json, vocab.txt   google-research's config field names; 96 uncased tokens
  bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001
                                a tiny BertForPreTraining (hidden 16, 2 layers, 2 heads) under
                                google-research's TF1 names, plus what a training checkpoint
                                also holds: global_step (int64) and two AdamWeightDecay slots
  variables.json                name -> shape, dtype and sha256 of the bytes of every tensor
                                handed to TensorFlow
  expected.npz                  a batch (input_ids, token_type_ids, attention_mask; row 1 has
                                two pads) and the transformers model's prediction_logits and
                                seq_relationship_logits on it (eval mode)
  dtypes_sharded/mixed.ckpt.*   a second checkpoint over two data shards (variables on two CPU
                                devices, Saver(sharded=True)) holding every other dtype the
                                reader supports; dtypes_sharded/values.json lists its tensors

The TF variables come from the transformers state dict through the mapping written out in
`tf_variables` below (not through zoo.convert.bert, which the fixture is there to check).
"""

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

OUT = Path(__file__).parent / "fixtures" / "google_bert_tiny"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (  # noqa: SIM905 (a word list reads better as text)
    "the a an of to in on at is was it he she they we you i and or but not this that with for "
    "from by as be have has had do did cat dog bird fish tree house car road sun moon star "
    "sky sea river hill city town day night time year man woman child book word song red blue "
    "green big small old new good bad run ran sat see saw go went come came eat ate . , ? ! "
    "##s ##ed ##ing ##er ##ly ##est"
).split()
VOCAB = SPECIAL + WORDS
CONFIG = {  # google-research/bert's bert_config.json fields
    "vocab_size": len(VOCAB), "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 32, "type_vocab_size": 2, "initializer_range": 0.02,
}
IDS = [[2, 5, 44, 3, 31, 70, 6, 3], [2, 28, 45, 18, 3, 60, 0, 0]]
TYPES = [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 0, 0]]
MASK = [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0]]
GLOBAL_STEP = 1234
# Optimizer slots as run_pretraining.py's AdamWeightDecayOptimizer names them.
SLOTS = ("bert/embeddings/LayerNorm/gamma/adam_m", "bert/embeddings/LayerNorm/gamma/adam_v")
# The second checkpoint: name -> (TF dtype, device, values[, shape]); every value is exact in
# its dtype. Devices 0 and 1 put the tensors in data shards 0 and 1.
MIXED = {
    "half": ("float16", 0, [[0.5, -1.25, 3.0], [65504.0, -0.0, 2.0 ** -14]]),
    "brain": ("bfloat16", 1, [1.0, -2.5, 1.5 * 2.0 ** 127, 0.0078125]),
    "double": ("float64", 0, [[0.1, -1e300], [2.0 ** -1074, 7.0]]),
    "ints/i32": ("int32", 1, [-(2 ** 31), 2 ** 31 - 1, 7]),
    "ints/i64": ("int64", 0, [[-(2 ** 63), 2 ** 63 - 1]]),
    "ints/u8": ("uint8", 1, [0, 255, 7]),
    "flags": ("bool", 0, [True, False, True]),
    "words": ("string", 1, [["", "abc"], ["\u00e9t\u00e9", "x" * 200]]),
    "scalar": ("float32", 0, 3.5),
    "empty": ("float32", 1, [], [0, 3]),
}

# Runs in the TensorFlow venv: argv = spec.json (name -> [dtype, device, values, shape]; values
# None: from arrays.npz), arrays.npz (or -), the checkpoint prefix, sharded (1 or 0).
TF_WRITER = r"""
import json, sys
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()  # TF1 graph mode and reference variables, as google-research
spec_path, arrays_path, prefix, sharded = sys.argv[1:]
spec = json.load(open(spec_path))
arrays = np.load(arrays_path) if arrays_path != "-" else {}
graph = tf.Graph()
with graph.as_default():
    variables = {}
    for name, (dtype, device, values, shape) in spec.items():
        value = arrays[name] if values is None else np.array(values, dtype=object if dtype
                                                             == "string" else None)
        if shape is not None:
            value = np.reshape(value, shape)
        with tf.device(f"/cpu:{device}"):
            if dtype == "string":
                initial = tf.constant(value, dtype=tf.string)
            else:
                initial = tf.cast(tf.constant(value), tf.as_dtype(dtype))
            variables[name] = tf.compat.v1.Variable(initial, name=name.replace("/", "_"))
    # A dict var_list: the checkpoint keys are exactly these names.
    saver = tf.compat.v1.train.Saver(variables, sharded=sharded == "1",
                                     write_version=tf.compat.v1.train.SaverDef.V2)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.save(sess, prefix, write_meta_graph=False, write_state=False)
"""


def hf_model() -> transformers.BertForPreTraining:
    """A seeded tiny BertForPreTraining, every parameter N(0, 0.2^2): HF's zero biases and unit
    LayerNorm gains would hide a misplaced bias or gain."""
    config = transformers.BertConfig(**CONFIG)
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # the tied decoder is the word embedding itself
            p.normal_(0.0, 0.2)
    return model


def tf_variables(state_dict) -> dict[str, np.ndarray]:
    """google-research/bert's variables of a transformers BertForPreTraining state dict: the
    inverse of transformers' load_tf_weights_in_bert. nn.Linear weights (out, in) become TF
    `kernel`s (in, out); the NSP layer's `output_weights` keep the (out, in) layout; LayerNorm
    weight/bias are gamma/beta; the MLM output bias is cls/predictions/output_bias."""
    out = {}
    for name, tensor in state_dict.items():
        x = tensor.detach().numpy().astype(np.float32)
        if name.startswith("cls.predictions.decoder.") or name.endswith("position_ids"):
            continue  # the tied copies of word_embeddings / output_bias; a buffer
        if name == "cls.predictions.bias":
            out["cls/predictions/output_bias"] = x
            continue
        if name.startswith("cls.seq_relationship."):
            kind = "output_weights" if name.endswith(".weight") else "output_bias"
            out[f"cls/seq_relationship/{kind}"] = x
            continue
        tf_name = re.sub(r"layer\.(\d+)\.", r"layer_\1.", name)
        if tf_name.endswith("_embeddings.weight"):
            tf_name = tf_name.removesuffix(".weight")
        elif ".LayerNorm." in tf_name:
            tf_name = tf_name.replace(".weight", ".gamma").replace(".bias", ".beta")
        elif tf_name.endswith(".weight"):
            tf_name, x = tf_name.removesuffix(".weight") + ".kernel", x.T
        out[tf_name.replace(".", "/")] = np.ascontiguousarray(x)
    return out


def sha256(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def json_lines(d: dict) -> str:
    """A JSON object with one key per line (short diffs, small files)."""
    return "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in d.items()) + "\n}\n"


def write_checkpoint(tf_python: str, spec: dict, arrays: dict, prefix: Path, sharded: bool):
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        arrays_path = "-"
        if arrays:
            arrays_path = str(Path(tmp) / "arrays.npz")
            np.savez(arrays_path, **arrays)
        subprocess.run([tf_python, "-c", TF_WRITER, str(spec_path), arrays_path, str(prefix),
                        "1" if sharded else "0"], check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tf-python", default="/tmp/tfvenv/bin/python",
                        help="a python with tensorflow installed")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for old in [*OUT.glob("*"), *OUT.glob("dtypes_sharded/*")]:
        if old.is_file():
            old.unlink()

    model = hf_model()
    variables = tf_variables(model.state_dict())
    rng = np.random.default_rng(0)
    for slot in SLOTS:
        variables[slot] = rng.normal(size=variables["bert/embeddings/LayerNorm/gamma"].shape
                                     ).astype(np.float32)
    variables["global_step"] = np.array(GLOBAL_STEP, np.int64)
    spec = {name: (str(x.dtype), 0, None, None) for name, x in variables.items()}
    write_checkpoint(args.tf_python, spec, variables, OUT / "bert_model.ckpt", sharded=False)
    manifest = {name: {"shape": list(x.shape), "dtype": str(x.dtype), "sha256": sha256(x)}
                for name, x in sorted(variables.items())}
    (OUT / "variables.json").write_text(json_lines(manifest))
    (OUT / "bert_config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    assert len(set(VOCAB)) == len(VOCAB) == CONFIG["vocab_size"]
    (OUT / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))

    ids, types, mask = (np.array(x, np.int32) for x in (IDS, TYPES, MASK))
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids).long(), token_type_ids=torch.from_numpy(
            types).long(), attention_mask=torch.from_numpy(mask).long())
    np.savez(OUT / "expected.npz", input_ids=ids, token_type_ids=types, attention_mask=mask,
             prediction_logits=out.prediction_logits.numpy(),
             seq_relationship_logits=out.seq_relationship_logits.numpy())

    mixed_dir = OUT / "dtypes_sharded"
    mixed_dir.mkdir(exist_ok=True)
    mixed = {name: (*spec, None)[:4] for name, spec in MIXED.items()}
    write_checkpoint(args.tf_python, mixed, {}, mixed_dir / "mixed.ckpt", sharded=True)
    (mixed_dir / "values.json").write_text(json_lines(
        {name: {"dtype": dtype, "shard": device, "values": values,
                "shape": list(np.shape(values)) if shape is None else shape}
         for name, (dtype, device, values, shape) in mixed.items()}))

    files = sorted(p for p in OUT.rglob("*") if p.is_file())
    for p in files:
        print(f"{p.stat().st_size:8d}  {p.relative_to(OUT)}")
    print(f"{sum(p.stat().st_size for p in files):8d}  total", file=sys.stderr)


if __name__ == "__main__":
    main()
