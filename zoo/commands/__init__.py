"""The command-line programs, above the library: each turns flags and a config into a run.

cli (train.py / eval.py's flags, start-up and one-line errors), jobs (config.task looked up and
handed to the loop: train, evaluate, build, dry_run), pipeline (jobs of several stages),
evaluate (eval of a trained workdir), attention_maps + attention_plot, word2vec_query, curves.
Nothing under zoo/ outside this package imports it.
"""
