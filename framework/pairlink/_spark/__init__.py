"""The Spark fan-out behind :mod:`pairlink.spark`, the only module that imports this package."""
