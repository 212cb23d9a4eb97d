"""Moved to zoo.data.pipelines.pretraining.store."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.store")
