"""The health check's wire form, shared by servers, gateways and clients.

A request to the address ``$health`` with the operation ``check`` and an optional argument
naming a service (a gateway: a route), answered ``{"status": "serving"}``, or ``{"status":
"draining"}`` once a graceful stop has begun; an unknown name is a 404. Servers answer it with
:class:`pairlink._server.health.Health`, gateways with :mod:`pairlink._gateway.health`; a
client with several replicas watches it (:mod:`pairlink._client.replicas`), and
:func:`pairlink._client.health.check_health` asks it once.

Why this shape: gRPC's health protocol (``grpc.health.v1.Health/Check``, an optional service
name, NOT_FOUND for an unknown one) is what probes such as ``grpc_health_probe`` speak, and AMQP
keeps ``$``-prefixed addresses for the nodes a container provides itself (``$management``,
``$cbs``), so ``$health`` never clashes with a user's service.
"""

from __future__ import annotations

HEALTH = "$health"
"""The address of the built-in health service."""
CHECK = "check"
"""Its one operation."""
SERVING = "serving"
DRAINING = "draining"
