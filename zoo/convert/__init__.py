"""Import/export of reference checkpoints (Hugging Face) as zoo parameter pytrees.

Each family is one module holding a rename table plus the reshapes the two layouts force:
`zoo.convert.gpt2` for GPT-2, `zoo.convert.bert` for BERT (Hugging Face and google-research TF
names); `zoo.convert.arrays` holds what they share.
"""
