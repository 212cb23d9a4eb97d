"""config.train.init_from: a run that starts from another run's params rather than from init.

The source is the workdir of a zoo run (its latest checkpoint, all of it or one subtree such as
the 'bert' encoder under a new head) or a Hugging Face / google-research/bert directory, read by
the loader the caller hands in (zoo.commands.jobs hands zoo.convert.hf's): the trainer reads zoo
checkpoints itself and stands on no conversion code. Every mismatch is a user error naming
config.train.init_from.
"""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from zoo import paths
from zoo.checkpoints import checkpoint
from zoo.checkpoints import restore_verdicts as verdicts
from zoo.checkpoints.checkpoint import Checkpointer, MissingParamsError
from zoo.checkpoints.checkpoint_failures import first_line
from zoo.errors import ConfigError, MissingFileError
from zoo.train import recipe
from zoo.train.state import TrainState

# A pretrained checkpoint directory -> its params pytree (numpy arrays), in the model's own
# structure (zoo.convert.hf.pretrained_params).
PretrainedLoader = Callable[[str], Any]


def init_params(workdir: str, state: TrainState, subtree: str | None = None,
                load_pretrained: PretrainedLoader | None = None) -> TrainState:
    """Starts a run from another run's latest params (e.g. BERT phase 2 from phase 1), or only
    their `subtree` (e.g. the 'bert' encoder under a new task head). `workdir` may also be a
    Hugging Face or google-research/bert checkpoint directory, which `load_pretrained` reads."""
    if recipe.is_pretrained_directory(workdir):
        if load_pretrained is None:
            raise ConfigError(
                f"config.train.init_from={workdir!r} is a pretrained checkpoint directory, and "
                "this run was given no reader for one: start it through train.py or "
                "zoo.commands.jobs.train, which read Hugging Face and google-research/bert "
                "directories (zoo.convert.hf)")
        return state.replace(params=_pretrained_params(workdir, state.params, subtree,
                                                       load_pretrained))
    paths.check_remote(workdir, "config.train.init_from")
    if not paths.as_path(workdir).is_dir():
        raise MissingFileError(
            f"config.train.init_from={workdir!r} is not a directory; point it at the workdir of "
            "a finished run, or a Hugging Face / google-research/bert checkpoint directory")
    source = checkpoint.existing(workdir)  # never creates <init_from>/checkpoints
    if source is None:
        raise MissingFileError(
            f"config.train.init_from={workdir!r} holds no checkpoint "
            f"({paths.join(workdir, 'checkpoints')}); point it at the "
            "workdir of a finished run"
        )
    where = f"config.train.init_from={workdir!r}"
    try:
        if subtree is None:
            params = source.restore_params(state.params, source=where)
        else:
            params = dict(state.params)
            params[subtree] = _restore_subtree(source, state.params[subtree], subtree, where)
        if jax.process_index() == 0:
            print(f"initialised params from {source.directory} step {source.latest_step()}",
                  flush=True)
    finally:
        source.close()
    return state.replace(params=params)


def _restore_subtree(source: Checkpointer, target, subtree: str, where: str = ""):
    """The checkpoint's params[subtree] (a pretraining run with heads: BERT under 'bert'), or all
    of its params when it is the bare model (a GPT language model under a classifier's 'gpt'),
    as _pretrained_params does for directories."""
    try:
        return source.restore_params({subtree: target}, source=where)[subtree]
    except MissingParamsError as nested:
        try:
            return source.restore_params(target, source=where)
        except MissingParamsError as bare:
            # Neither layout fits: report the closer one (a checkpoint with a `subtree` that
            # lacks a layer is a deeper model, not another family).
            raise min(bare, nested, key=lambda e: len(e.missing) / e.wanted) from None


def _pretrained_params(directory: str, params, subtree: str | None, load: PretrainedLoader):
    """`params` with `subtree` (or all of them) replaced by a pretrained checkpoint's, each
    array placed on the sharding of the parameter it replaces.

    With several processes, process 0 alone reads and converts the checkpoint and broadcasts
    the arrays to the others (a bucket is read once per run, not once per host); whether its
    read succeeded is gathered first (restore_verdicts.agree), so the others stop with its
    reason instead of waiting in the broadcast."""
    target = params if subtree is None else params[subtree]
    where = f"config.train.init_from={directory!r}"
    loaded, error, code, reason = None, None, verdicts.OK, ""
    if jax.process_index() == 0:
        try:
            loaded = _read_pretrained(directory, target, subtree, where, load)
        except Exception as e:  # noqa: BLE001 -- raised below, once every process knows
            error, code, reason = e, verdicts.ERROR, first_line(e)
    code, process, reason = verdicts.agree(code, reason)
    if error is not None:
        raise error
    if code != verdicts.OK:
        raise verdicts.CheckpointRestoreError(
            f"{where}: process {process} of {jax.process_count()}, which reads it for every "
            f"process, could not ({reason}); its log says why. Nothing was changed")
    if jax.process_count() > 1:
        loaded = broadcast_from_first(
            loaded if loaded is not None else jax.tree.map(
                lambda b: np.zeros(b.shape, b.dtype), target))
    placed = jax.tree.map(lambda a, b: jax.device_put(a, b.sharding), loaded, target)
    if jax.process_index() == 0:
        print(f"initialised {subtree or 'params'} from {directory}", flush=True)
    if subtree is None:
        return placed
    return {**params, subtree: placed}


def _read_pretrained(directory: str, target, subtree: str | None, where: str,
                     load: PretrainedLoader):
    """The checkpoint's params for `target` (params[subtree], or all of them) as host arrays
    in target's dtypes; a ConfigError when its tree or shapes are another model's."""
    loaded = load(directory)
    if subtree is not None:
        # A checkpoint with a head holds the encoder under `subtree` ('bert'); a bare encoder
        # (BertModel) is the subtree itself.
        loaded = loaded.get(subtree, loaded)
    if jax.tree.structure(loaded) != jax.tree.structure(target):
        def top(tree):
            return sorted(map(str, tree)) if isinstance(tree, dict) else type(tree).__name__
        raise ConfigError(
            f"{where} is not a checkpoint of this model: its parameters {top(loaded)} do not "
            f"match this model's {subtree or 'parameters'} {top(target)} (a different "
            "architecture or head); point init_from at a checkpoint of the model this task "
            "fine-tunes")
    from zoo.models import config_checks  # which config key shapes which parameter

    def shapes(tree):
        return {jax.tree_util.keystr(path): np.shape(leaf)
                for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}

    mismatched = config_checks.shape_mismatches(shapes(loaded), shapes(target))
    if mismatched:
        raise ConfigError(f"{where}: {len(mismatched)} parameter shapes differ from this "
                          f"model's: {'; '.join(mismatched[:3])}. The model config must be the "
                          "checkpoint's")
    return jax.tree.map(lambda a, b: np.asarray(a, b.dtype), loaded, target)


# Arrays per broadcast: each device holds a chunk twice (in and out) while it is sent.
BROADCAST_CHUNK_BYTES = 256 << 20


def broadcast_from_first(tree):
    """`tree` (host arrays, the same shapes on every process) as process 0 has it, on every
    process: multihost_utils.broadcast_one_to_all in chunks of BROADCAST_CHUNK_BYTES, so a
    large model never sits whole on each device twice."""
    leaves, structure = jax.tree.flatten(tree)
    out, chunk, size = [], [], 0
    for leaf in leaves + [None]:
        if chunk and (leaf is None or size + leaf.nbytes > BROADCAST_CHUNK_BYTES):
            out += multihost_utils.broadcast_one_to_all(chunk)
            chunk, size = [], 0
        if leaf is not None:
            chunk.append(leaf)
            size += leaf.nbytes
    return jax.tree.unflatten(structure, out)
