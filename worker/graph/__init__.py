"""The graph store: a narrow protocol and its Neo4j implementation (all Cypher lives in cypher.py)."""
