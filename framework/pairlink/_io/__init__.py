"""The Trio layer over the sans-IO engine: a connection's read, write and timer loops, the link
API (senders and receivers owned by the layers above), URLs, connecting and listening, TLS."""
