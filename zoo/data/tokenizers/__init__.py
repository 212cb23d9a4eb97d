"""Tokenizers behind one interface: SentencePiece, BERT's WordPiece, GPT-2's byte-level BPE."""
