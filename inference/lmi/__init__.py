"""The LMI CLI's former name: `python -m inference.lmi` runs `python -m inference.llm.lmi` (the code lives there)."""
