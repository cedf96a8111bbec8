"""specguard: measure whether speculative decoding pays, per traffic class, and guard it."""

__version__ = "0.1.0"
