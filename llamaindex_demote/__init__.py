"""LlamaIndex adapter for demote."""
