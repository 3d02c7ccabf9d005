"""LLM calls through litellm (imported lazily, on the first call), their error classification and rate limit."""
