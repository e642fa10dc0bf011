"""LangChain adapter for demote."""
