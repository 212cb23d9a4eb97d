"""Moved to zoo.data.pipelines.pretraining.run_order."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.run_order")
