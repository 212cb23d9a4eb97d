"""Metrics that reproduce their reference implementations exactly: SQuAD v1.1/v2.0 EM and F1
(the official scripts), classification accuracy/F1/MCC (GLUE), corpus BLEU (sacrebleu) and
ROUGE (rouge-score); and the attention weights a model computed for one input, per layer and
head (attention_maps)."""
