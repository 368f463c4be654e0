"""The client for plain synchronous code (scripts, notebooks, Spark workers): the calls of
:mod:`pairlink.client`, blocking. ``with connect(url) as conn: conn.service("calc").add(1, 2)``.

One Trio loop per process runs in a daemon thread and serves every blocking client of the
process, so any number of threads may call at once; a forked child gets a fresh one.
"""

from pairlink._client.blocking import Client, ServiceProxy, connect

__all__ = ["Client", "ServiceProxy", "connect"]
