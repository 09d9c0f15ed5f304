"""The asyncio shell: the only layer with sockets."""
