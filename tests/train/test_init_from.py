"""config.train.init_from of a pretrained directory is read by the loader the caller hands the
trainer (zoo.commands.jobs hands zoo.convert.hf's): the trainer stands on no conversion code.
train.py's path through it, a Hugging Face directory fine-tuned, is
tests/tasks/test_classification_finetune.py::test_init_from_a_hugging_face_directory."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from zoo.errors import ConfigError
from zoo.train import init_from
from zoo.train.state import TrainState


def _pretrained_directory(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return str(directory)


def test_a_pretrained_directory_is_read_by_the_loader_handed_in(tmp_path):
    directory = _pretrained_directory(tmp_path)
    state = TrainState.create({"w": jnp.ones((2, 3))}, optax.sgd(0.1), jax.random.key(0))
    read = []

    def load(path):
        read.append(path)
        return {"w": np.full((2, 3), 7.0, np.float32)}

    started = init_from.init_params(directory, state, load_pretrained=load)
    assert read == [directory]
    np.testing.assert_array_equal(np.asarray(started.params["w"]), np.full((2, 3), 7.0))
    with pytest.raises(ConfigError, match="given no reader for one: start it through train.py"):
        init_from.init_params(directory, state)

