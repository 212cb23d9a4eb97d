"""How a scanned layer stack runs on the platform at hand (config.model.scan_unroll).

A stack with scan_layers=True keeps its layers' parameters stacked on one axis and runs them in
a loop: one compiled layer, so a 24-layer model compiles as fast as a 1-layer one, which on a
TPU is what makes a pod's compile take minutes, not an hour. On a CPU the loop is what costs:
each iteration slices its layer's weights out of the stack and writes its residuals into the
stacked buffers the backward pass reads (measured on the 2-core box: 6-11% of a GPT small train
step, 2-3% of BERT small's), and compile time is small at CPU sizes. So 'auto' (0, the configs'
default) unrolls the loop whole (-1) when the train step runs on CPUs and keeps one layer per
iteration anywhere else. The parameters keep their stacked layout either way: a checkpoint
saved under one setting restores under the other.
"""

import ml_collections

AUTO, ALL = 0, -1


def resolve(config: ml_collections.ConfigDict, platforms: tuple[str, ...]
            ) -> ml_collections.ConfigDict:
    """`config` with config.model.scan_unroll settled for a step built for `platforms` (a copy
    when 'auto' changes; the same config otherwise). A value below -1 is a ConfigError."""
    from zoo.errors import ConfigError

    model = config.get("model")
    if model is None or "scan_unroll" not in model:
        return config
    value = model.scan_unroll
    if not isinstance(value, int) or value < ALL:
        raise ConfigError(f"config.model.scan_unroll={value!r}: use 0 (auto), -1 (all layers) "
                          "or the layers per iteration of the layer scan (1, 2, ...)")
    if value != AUTO:
        return config
    settled = config.copy_and_resolve_references()  # the caller's config stays as given
    settled.model.scan_unroll = ALL if set(platforms) == {"cpu"} else 1
    return settled
