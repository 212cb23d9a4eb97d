"""Moved to zoo.data.pipelines.pretraining.free_space."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.free_space")
