"""Prompts as data: one module per prompt, each a pure builder of chat messages plus its response model."""
