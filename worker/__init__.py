"""Memory extraction and recall: settings, models, graph store, extraction and the Celery app.

Importing this package does no work: nothing connects and litellm is not imported until an LLM call.
"""
