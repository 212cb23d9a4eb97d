"""Moved to zoo.data.pipelines.pretraining.range_reader."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.range_reader")
