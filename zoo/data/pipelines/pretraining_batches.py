"""Moved to zoo.data.pipelines.pretraining.batches."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.batches")
