"""Metrics that reproduce their reference implementations exactly: SQuAD v1.1/v2.0 EM and F1
(the official scripts), classification accuracy/F1/MCC (GLUE), corpus BLEU (sacrebleu) and
ROUGE (rouge-score)."""
