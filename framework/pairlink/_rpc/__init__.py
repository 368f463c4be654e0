"""The conventions of a call, shared by clients, servers and gateways: how a request and its
reply look on the wire, payload encodings, link pairing (LINK_PAIR_V1_0) and deadlines."""
