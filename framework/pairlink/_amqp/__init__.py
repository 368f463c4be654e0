"""Sans-IO AMQP 1.0: type system, codec, frames, and the connection engine."""
