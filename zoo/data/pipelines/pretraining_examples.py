"""Moved to zoo.data.pipelines.pretraining.examples (issue 31)."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.examples")
