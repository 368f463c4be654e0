"""Interop tests against Apache Qpid Proton, and the Proton peers they use."""
