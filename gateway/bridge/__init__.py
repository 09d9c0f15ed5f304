"""The cloud bridge: pure topic mapping and backoff; the link uses aiomqtt."""
