"""SQuAD features prepared once (`python -m zoo.commands.prepare` with a SQuAD config) and read
back by the SQuAD task, which then never tokenizes or featurizes:

    <directory>/tokenizer/                 the tokenizer (zoo.data.tokenizers.prepared)
    <directory>/train.npz                  the training windows (squad.featurize's arrays)
    <directory>/validation.npz             the evaluation windows
    <directory>/validation_examples.json   the evaluation examples (post-processing and scoring)
    <directory>/settings.json              what shaped them; written last: the proof of a
                                           finished preparation
"""

import io
import json

import numpy as np

from zoo import paths, retry
from zoo.errors import AccessDeniedError, DataError, UserError

SETTINGS = "settings.json"


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def write(directory, settings: dict, train: dict[str, np.ndarray],
          validation: dict[str, np.ndarray], validation_examples: list[dict]) -> dict:
    """Writes the directory, the settings file last; returns the settings written (with the
    window counts)."""
    directory = paths.as_path(directory)
    paths.write_atomic(directory / "train.npz", _npz(train))
    paths.write_atomic(directory / "validation.npz", _npz(validation))
    paths.write_atomic(directory / "validation_examples.json", json.dumps(validation_examples))
    settings = {**settings, "train_windows": len(train["input_ids"]),
                "validation_windows": len(validation["input_ids"])}
    paths.write_atomic(directory / SETTINGS, json.dumps(settings))
    return settings


def finished(directory) -> bool:
    return (paths.as_path(directory) / SETTINGS).exists()


def read(directory) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray], list[dict]]:
    """(settings, train features, validation features, validation examples)."""
    directory = paths.as_path(directory)
    try:
        settings = json.loads((directory / SETTINGS).read_text())
        arrays = []
        for split in ("train", "validation"):
            with (directory / f"{split}.npz").open("rb") as f:
                with np.load(io.BytesIO(f.read())) as npz:
                    arrays.append({k: npz[k] for k in npz.files})
        examples = json.loads((directory / "validation_examples.json").read_text())
    except (OSError, ValueError, KeyError) as e:
        if isinstance(e, UserError):  # zoo.retry gave up: the storage failed, not the data
            raise
        if retry.is_access_denied(e):
            raise AccessDeniedError(
                f"prepared SQuAD features {directory}: reading was refused ({e}); these "
                "credentials may not read them. They are not known to be damaged: give them "
                "read access and run again") from e
        raise DataError(f"prepared SQuAD features {directory} are incomplete or corrupt ({e}); "
                        f"delete {directory} and prepare them again") from None
    return settings, arrays[0], arrays[1], examples
