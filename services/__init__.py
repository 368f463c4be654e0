"""Deployable pairlink services (each a module with ``@service`` classes)."""
