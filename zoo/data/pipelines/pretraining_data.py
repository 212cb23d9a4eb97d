"""Moved to zoo.data.pipelines.pretraining.job_data."""
from zoo import deprecation

deprecation.moved(__name__, "zoo.data.pipelines.pretraining.job_data")
