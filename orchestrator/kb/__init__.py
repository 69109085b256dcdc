"""The knowledge base as read from disk: notes and their frontmatter, gates and the gate
catalog, and the caches that make a walk of a large KB cheap. Nothing here writes."""
