"""Moved to zoo.data.pipelines.pretraining.records."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.records")
