"""Gateway tests (issue 4): the chain through GN and GO, byte taps, config and CLI."""
