"""Model families: a frozen <Family>Config dataclass plus Linen modules and heads each."""
