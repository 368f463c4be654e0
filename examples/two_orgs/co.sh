#!/bin/sh
# CO: organisation O's service container, an ordinary pairlink server. It serves the echo
# service under its internal address, which only GO knows.
exec pairlink serve services.echo:Echo --address billing.internal --listen amqp://127.0.0.1:25671
