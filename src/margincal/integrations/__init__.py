"""margincal from other training stacks: :mod:`margincal.integrations.hf` (Hugging Face ``Trainer``)."""
