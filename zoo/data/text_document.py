"""The document type the text readers and writers accept besides a plain list of sentences.

Its own module so that zoo.data.readers.text_files can name it without importing
zoo.data.synthetic.documents, whose Document it describes and which imports text_files (the
synthetic corpus is written in BERT's text format): a structural type, so neither side imports
the other for it.
"""

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class TextDocument(Protocol):
    """A document that gives its sentences, in order, as `texts`."""

    @property
    def texts(self) -> Sequence[str]: ...
