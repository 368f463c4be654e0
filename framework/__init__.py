"""pairlink: Trio actors serving request-response over AMQP 1.0 paired links.

The sans-IO protocol engine lives in :mod:`framework.amqp`; nothing here imports pyspark.
"""
