"""The manual's sources; ``docs.gen`` writes its generated pages and the man pages."""
