"""Networks and what is measured on them: :mod:`distrl.nn.dormant` (the share of dormant units)."""
