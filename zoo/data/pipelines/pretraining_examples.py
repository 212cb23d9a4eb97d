"""Moved to zoo.data.pipelines.pretraining.examples."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.examples")
