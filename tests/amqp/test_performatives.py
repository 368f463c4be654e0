"""Performatives and messaging composites: declarations against the XML, round trips, and
interop with Qpid Proton in both directions (its bytes decoded by us, ours accepted by it)."""

from __future__ import annotations

import datetime
import pathlib
import uuid
import xml.etree.ElementTree as ET
from typing import Any

import attrs
import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairlink._amqp.codec import decode, encode
from pairlink._amqp.errors import INVALID_FIELD, LocalProtocolError, RemoteProtocolError
from pairlink._amqp.framing import (
    AMQP_HEADER,
    FRAME_SASL,
    SASL_HEADER,
    Frame,
    FrameReader,
    encode_frame,
)
from pairlink._amqp.messaging import (
    DIST_COPY,
    DURABLE_UNSETTLED_STATE,
    EXPIRY_NEVER,
    Accepted,
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeleteOnClose,
    DeleteOnNoLinks,
    DeleteOnNoLinksOrMessages,
    DeleteOnNoMessages,
    DeliveryAnnotations,
    Error,
    Footer,
    Header,
    MessageAnnotations,
    Modified,
    Properties,
    Received,
    Rejected,
    Released,
    Source,
    Target,
)
from pairlink._amqp.performatives import (
    PERFORMATIVES_BY_CODE,
    PERFORMATIVES_BY_NAME,
    RCV_SECOND,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SASL_OK,
    SASL_SYS_TEMP,
    SND_SETTLED,
    SPEC_CLASSES,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
    Transfer,
)
from pairlink._amqp.types import Described, FieldSpec, Symbol, ULong, amqp_field

SPEC_DIR = pathlib.Path("/work/shared/amqp-spec")
NS = "{http://www.amqp.org/schema/amqp.xsd}"
S = Symbol
T0 = datetime.datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=datetime.UTC)

# --------------------------------------------------------------------------- the XML, parsed


def _xml_types() -> dict[str, ET.Element]:
    types: dict[str, ET.Element] = {}
    for name in ("transport.xml", "messaging.xml", "security.xml"):
        for t in ET.parse(SPEC_DIR / name).getroot().iter(f"{NS}type"):
            types[t.attrib["name"]] = t
    return types


XML_TYPES = _xml_types()
XML_DESCRIBED = {n: t for n, t in XML_TYPES.items() if t.find(f"{NS}descriptor") is not None}


def _xml_default(field: ET.Element) -> Any:
    """The Python value of a field's XML default (a choice name, a boolean or a number)."""
    raw = field.attrib.get("default")
    if raw is None:
        return None
    ftype = XML_TYPES.get(field.attrib["type"])
    if ftype is not None:
        for choice in ftype.iter(f"{NS}choice"):
            if choice.attrib["name"] == raw:
                raw = choice.attrib["value"]
        base = ftype.attrib["source"]
    else:
        base = field.attrib["type"]
    if base == "boolean" or raw in ("true", "false"):
        return raw == "true"
    if base == "symbol":
        return raw
    return int(raw)


def _resolved(xml_type: str) -> str:
    """What the codec makes of a spec type name (``handle`` -> ``uint``...)."""
    field = amqp_field(xml_type)
    spec = next(v for v in field.metadata.values() if isinstance(v, FieldSpec))
    return spec.amqp_type


@pytest.mark.parametrize("type_name", sorted(XML_DESCRIBED))
def test_declaration_matches_xml(type_name: str) -> None:
    xml = XML_DESCRIBED[type_name]
    desc = xml.find(f"{NS}descriptor")
    assert desc is not None
    code = int(desc.attrib["code"].split(":")[1], 16)
    cls = PERFORMATIVES_BY_NAME[desc.attrib["name"]]
    assert PERFORMATIVES_BY_CODE[code] is cls
    assert cls.__amqp_descriptor__ == (code, desc.attrib["name"])  # type: ignore[attr-defined]
    assert cls.__name__ == "".join(p.capitalize() for p in type_name.split("-"))
    provides = [p.strip() for p in xml.attrib.get("provides", "").split(",") if p.strip()]
    assert list(cls.__amqp_provides__) == provides  # type: ignore[attr-defined]
    if xml.attrib["class"] == "restricted":
        assert [f.name for f in attrs.fields(cls)] == ["value"]
        return
    xml_fields = list(xml.iter(f"{NS}field"))
    specs: tuple[tuple[str, FieldSpec], ...] = cls.__amqp_fields__  # type: ignore[attr-defined]
    assert [name for name, _ in specs] == [f.attrib["name"].replace("-", "_") for f in xml_fields]
    for (name, spec), f in zip(specs, xml_fields, strict=True):
        # a "*" field is declared with the type it requires (message-id, address, source...)
        xml_type = f.attrib["type"]
        if xml_type == "*" and "requires" in f.attrib:
            xml_type = f.attrib["requires"]
        assert spec.amqp_type == _resolved(xml_type), name
        assert spec.requires == (xml_type if _resolved(xml_type) == "*" else None), name
        restricted_type = XML_TYPES.get(xml_type)
        choices = (
            {c.attrib["value"] for c in restricted_type.iter(f"{NS}choice")}
            if restricted_type is not None
            else set()
        )
        if choices and xml_type != "role":  # (both booleans are roles: nothing to check)
            assert {str(c).lower() for c in spec.choices or ()} == choices, name
        else:
            assert spec.choices is None, name
        assert spec.mandatory == (f.attrib.get("mandatory") == "true"), name
        assert spec.multiple == (f.attrib.get("multiple") == "true"), name
        assert spec.default == _xml_default(f), name
        assert attrs.fields_dict(cls)[name].default == spec.default, name


def test_lookup_covers_exactly_the_spec() -> None:
    descriptors = [t.find(f"{NS}descriptor") for t in XML_DESCRIBED.values()]
    names = {d.attrib["name"] for d in descriptors if d is not None}
    assert set(PERFORMATIVES_BY_NAME) == names
    assert len(PERFORMATIVES_BY_CODE) == len(names) == len(SPEC_CLASSES)
    assert set(PERFORMATIVES_BY_CODE.values()) == set(SPEC_CLASSES)
    assert 0x10 in PERFORMATIVES_BY_CODE
    assert 0x10 not in PERFORMATIVES_BY_NAME  # type: ignore[comparison-overlap]
    assert "amqp:open:list" not in PERFORMATIVES_BY_CODE  # type: ignore[comparison-overlap]
    assert 0x99 not in PERFORMATIVES_BY_CODE and "amqp:nope:list" not in PERFORMATIVES_BY_NAME


# ------------------------------------------------------------------------------ round trips

ERR = Error(condition="amqp:link:stolen", description="taken", info={S("by"): "x"})
SOURCE = Source(
    address="queue/a",
    durable=DURABLE_UNSETTLED_STATE,
    expiry_policy=EXPIRY_NEVER,
    timeout=30,
    dynamic=True,
    dynamic_node_properties={S("lifetime-policy"): DeleteOnClose()},
    distribution_mode=DIST_COPY,
    filter={S("sel"): Described(S("apache.org:selector-filter:string"), "a = 1")},
    default_outcome=Modified(delivery_failed=True),
    outcomes=[S("amqp:accepted:list"), S("amqp:released:list")],
    capabilities=[S("queue")],
)
TARGET = Target(
    address="queue/b",
    durable=1,
    expiry_policy=S("link-detach"),
    timeout=5,
    dynamic=True,
    dynamic_node_properties={S("supported-dist-modes"): [S("move")]},
    capabilities=[S("topic"), S("shared")],
)

# Every spec class with every field set away from its default (where it has one).
FULL: list[Any] = [
    Open("c1", "host", 512, 7, 60000, [S("en")], [S("de"), S("fr")], [S("a")], [S("b")],
         {S("product"): "pairlink"}),
    Begin(3, 10, 2048, 100, 16, [S("x")], [S("y")], {S("p"): True}),
    Attach("link", 4, ROLE_RECEIVER, SND_SETTLED, RCV_SECOND, SOURCE, TARGET,
           {b"tag": Accepted()}, True, 12, 1 << 40, [S("c")], [S("d")], {S("e"): 1}),
    Flow(1, 200, 2, 300, 4, 5, 6, 7, True, True, {S("f"): None}),
    Transfer(1, 2, b"t", 0x01020304, True, True, RCV_SECOND, Received(section_number=1,
             section_offset=9), True, True, True),
    Disposition(ROLE_SENDER, 5, 9, True, Rejected(error=ERR), True),
    Detach(9, True, ERR),
    End(ERR),
    Close(ERR),
    SaslMechanisms([S("PLAIN"), S("ANONYMOUS")]),
    SaslInit(S("PLAIN"), b"\x00u\x00p", "example.org"),
    SaslChallenge(b"nonce"),
    SaslResponse(b"answer"),
    SaslOutcome(SASL_SYS_TEMP, b"extra"),
    ERR,
    Header(True, 9, 1000, True, 3),
    DeliveryAnnotations({S("x-opt-a"): 1, ULong(7): "reserved"}),
    MessageAnnotations({S("x-opt-b"): [1, 2]}),
    Properties(uuid.UUID(int=5), b"user", "to/addr", "subj", "reply/addr", ULong(77),
               S("application/msgpack"), S("gzip"), T0, T0, "grp", 4, "rgrp"),
    ApplicationProperties({"operation": "add", "n": 3}),
    Data(b"\x00\x01binary"),
    AmqpSequence([1, "two", [3]]),
    AmqpValue({"k": [1.5, None, True]}),
    Footer({S("x-opt-sig"): b"\xff" * 32}),
    Received(3, 1 << 33),
    Accepted(),
    Rejected(ERR),
    Released(),
    Modified(True, False, {S("x-opt-retry"): 2}),
    SOURCE,
    TARGET,
    DeleteOnClose(),
    DeleteOnNoLinks(),
    DeleteOnNoMessages(),
    DeleteOnNoLinksOrMessages(),
]  # fmt: skip
MANDATORY_ONLY: list[Any] = [
    Open(container_id="c"),
    Begin(next_outgoing_id=0, incoming_window=0, outgoing_window=0),
    Attach(name="n", handle=0, role=ROLE_SENDER),
    Flow(incoming_window=0, next_outgoing_id=0, outgoing_window=0),
    Transfer(handle=0),
    Disposition(role=ROLE_RECEIVER, first=0),
    Detach(handle=0),
    End(),
    Close(),
    SaslInit(mechanism="ANONYMOUS"),
    SaslOutcome(code=SASL_OK),
    Error(condition="amqp:internal-error"),
    Header(),
    Properties(),
    Source(),
    Target(),
    Modified(),
    Rejected(),
]


def test_samples_cover_every_class() -> None:
    assert {type(x) for x in FULL} == set(SPEC_CLASSES)
    for x in FULL:
        for f in attrs.fields(type(x)):
            assert getattr(x, f.name) is not None and getattr(x, f.name) != f.default, f.name


@pytest.mark.parametrize("value", FULL + MANDATORY_ONLY, ids=lambda v: type(v).__name__)
def test_round_trip(value: Any) -> None:
    encoded = encode(value)
    assert decode(encoded) == value
    assert encode(decode(encoded)) == encoded


def _without_binary_keys(value: Any) -> bool:
    # Proton's Python Data cannot hold binary map keys (it hands out unhashable memoryviews).
    return not isinstance(value, Attach)


@pytest.mark.parametrize(
    "value",
    [v if _without_binary_keys(v) else attrs.evolve(v, unsettled=None)
     for v in FULL + MANDATORY_ONLY],
    ids=lambda v: type(v).__name__,
)  # fmt: skip
def test_proton_data_reads_and_rewrites_ours(value: Any) -> None:
    """Proton parses every encoding we write, and what it writes back means the same."""
    encoded = encode(value)
    data = proton.Data()
    assert data.decode(encoded) == len(encoded)
    obj = data.get_object()
    assert isinstance(obj, proton.Described)
    assert obj.descriptor == type(value).__amqp_descriptor__[0]
    again = proton.Data()
    again.put_object(obj)
    assert decode(again.encode()) == value


def test_defaults_are_written_as_nothing() -> None:
    # Every field at its default: the list collapses to list0 after the descriptor.
    for cls in (Header, Source, Target, Properties, Modified, Rejected):
        code: int = getattr(cls, "__amqp_descriptor__")[0]  # noqa: B009 (set by the codec)
        assert encode(cls()) == b"\x00\x53" + bytes([code]) + b"\x45"
    assert encode(Transfer(handle=0)) == bytes.fromhex("005314c0020143")
    # Trailing defaults vanish, inner ones become null: max-frame-size set, channel-max default.
    assert encode(Open(container_id="a", max_frame_size=512)) == bytes.fromhex(
        "005310c00a03a10161407000000200"
    )


def test_null_fields_decode_to_defaults() -> None:
    # A header of five nulls: the defaults of durable, priority, first-acquirer, delivery-count.
    assert decode(bytes.fromhex("005370c006054040404040")) == Header()
    assert decode(bytes.fromhex("005328c00c0b") + b"\x40" * 11) == Source()


def test_extra_trailing_fields_are_ignored() -> None:
    # end with no error plus two fields from a future version of the spec.
    assert decode(bytes.fromhex("005317c005034041a100")) == End()


def test_mandatory_fields() -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        decode(bytes.fromhex("005310c0020140"))  # open with a null container-id
    assert exc.value.condition == INVALID_FIELD
    with pytest.raises(RemoteProtocolError):
        decode(bytes.fromhex("005323c003015201"))  # received without section-offset
    with pytest.raises(LocalProtocolError):
        encode(Attach(name="n", handle=0))  # role missing


def test_symbolic_descriptors_decode_too() -> None:
    raw = bytes.fromhex("00a30f616d71703a636c6f73653a6c697374") + bytes.fromhex("45")
    assert decode(raw) == Close()
    assert decode(b"\x00\x80" + (0x24).to_bytes(8, "big") + b"\x45") == Accepted()


def test_multiple_fields_accept_a_single_value() -> None:
    # offered-capabilities as one symbol rather than an array: decodes as a one-item list.
    raw = bytes.fromhex("005310c00d08a10163404040404040a30178")
    value = decode(raw)
    assert isinstance(value, Open) and value.offered_capabilities == [S("x")]


# -------------------------------------------------- hypothesis: random field values per type

_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "uint": st.integers(0, 2**32 - 1),
    "ushort": st.integers(0, 2**16 - 1),
    "ubyte": st.integers(0, 255),
    "ulong": st.integers(0, 2**64 - 1),
    "boolean": st.booleans(),
    "string": st.text(max_size=20),
    "symbol": st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=12).map(S),
    "binary": st.binary(max_size=300),
    "timestamp": st.datetimes(
        min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2200, 1, 1),
        timezones=st.just(datetime.UTC),
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    "fields": st.dictionaries(
        st.text(st.characters(max_codepoint=127), max_size=8).map(S),
        st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)),
        max_size=3,
    ),
    "map": st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
    "*": st.one_of(st.none(), st.text(max_size=5), st.builds(ULong, st.integers(0, 2**64 - 1))),
    "message-id": st.one_of(st.text(max_size=5), st.integers(0, 2**64 - 1), st.uuids()),
}  # fmt: skip


# A field that requires a described type gets one that provides it; a choice field a choice.
_PROVIDERS: dict[str, st.SearchStrategy[Any]] = {
    "outcome": st.sampled_from([Accepted(), Released(), Rejected(error=Error("amqp:x")),
                                Modified(delivery_failed=True)]),
    "error": st.builds(Error, condition=_SCALARS["symbol"], description=st.text(max_size=5)),
    "source": st.builds(Source, address=st.text(max_size=5)),
    "target": st.builds(Target, address=st.text(max_size=5)),
}  # fmt: skip
_PROVIDERS["delivery-state"] = _PROVIDERS["outcome"] | st.builds(
    Received, section_number=_SCALARS["uint"], section_offset=_SCALARS["ulong"]
)


def _strategy(cls: type) -> st.SearchStrategy[Any]:
    kwargs = {}
    for name, spec in cls.__amqp_fields__:  # type: ignore[attr-defined]
        if spec.requires is not None:
            one = _PROVIDERS[spec.requires]
        elif spec.choices is not None:
            one = st.sampled_from(sorted(spec.choices))
        else:
            one = _SCALARS[spec.amqp_type]
        if spec.multiple:
            one = st.lists(one, min_size=1, max_size=4)
        kwargs[name] = one if spec.mandatory else st.one_of(st.none(), one)
    return st.builds(cls, **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([Open, Begin, Attach, Flow, Transfer, Disposition, Detach, Header,
                     Properties, SaslInit, SaslMechanisms, SaslOutcome, Received, Modified,
                     Source, Target]).flatmap(_strategy)
)  # fmt: skip
def test_random_round_trip(value: Any) -> None:
    decoded = decode(encode(value))
    for name, spec in type(value).__amqp_fields__:
        want = getattr(value, name)
        assert getattr(decoded, name) == (spec.default if want is None else want), name


# ------------------------------------------------------------------- Proton engine interop


class ProtonEnd:
    """A Proton connection engine on one side of an in-memory wire, we are the other side."""

    def __init__(self, transport: proton.Transport) -> None:
        self.transport = transport
        self.reader = FrameReader()
        self.expect_header = True  # the engine knows when a protocol header comes; so do we

    def frames(self) -> list[Frame]:
        """Everything Proton has written since the last call, parsed by our FrameReader
        (a protocol header shows up as a pseudo-frame of type -1 holding the 8 bytes)."""
        n = self.transport.pending()
        if n > 0:
            self.reader.feed(self.transport.peek(n) or b"")
            self.transport.pop(n)
        out: list[Frame] = []
        while True:
            if self.expect_header:
                header = self.reader.read_protocol_header()
                if header is None:
                    return out
                self.expect_header = False
                out.append(Frame(-1, -1, header, memoryview(b"")))
                continue
            frame = self.reader.read_frame()
            if frame is None:
                return out
            out.append(frame)

    def send(self, *frames: Any, channel: int = 0, frame_type: int = 0, raw: bytes = b"") -> None:
        out = bytearray(raw)
        for f in frames:
            payload = b""
            if isinstance(f, tuple):
                f, payload = f
            encode_frame(out, channel, f, payload, frame_type)
        self.transport.push(bytes(out))
        assert self.transport.condition is None, self.transport.condition


def _performatives(frames: list[Frame]) -> list[Any]:
    return [f.performative for f in frames]


def test_proton_open_bytes_decode() -> None:
    """An open frame exactly as Proton 0.40 writes it (captured from Transport.peek)."""
    raw = bytes.fromhex("0000001e02000000005310c01104a103636964a101687000008000607fff")
    reader = FrameReader()
    reader.feed(raw)
    frame = reader.read_frame()
    assert frame is not None and frame.channel == 0
    assert frame.performative == Open(
        container_id="cid", hostname="h", max_frame_size=32768, channel_max=32767
    )


def test_proton_client_link_lifecycle() -> None:
    conn = proton.Connection()
    conn.container = "proton-client"
    conn.hostname = "svc.example"
    conn.properties = {proton.symbol("product"): "proton"}
    conn.offered_capabilities = proton.SymbolList([proton.symbol("ANONYMOUS-RELAY")])
    transport = proton.Transport()
    transport.idle_timeout = 30.0
    transport.bind(conn)
    peer = ProtonEnd(transport)
    conn.open()
    ssn = conn.session()
    ssn.open()
    snd = ssn.sender("pl-link")
    snd.source.address = "from-here"
    snd.target.address = "to-there"
    snd.target.capabilities.put_array(False, proton.Data.SYMBOL)
    snd.open()

    frames = peer.frames()
    assert frames[0].performative == AMQP_HEADER
    op, begin, attach = _performatives(frames[1:])
    assert isinstance(op, Open)
    assert op.container_id == "proton-client" and op.hostname == "svc.example"
    assert op.idle_time_out == 15000  # Proton advertises half its timeout
    assert op.properties == {S("product"): "proton"}
    assert op.offered_capabilities == [S("ANONYMOUS-RELAY")]
    assert isinstance(begin, Begin) and begin.remote_channel is None
    assert isinstance(attach, Attach)
    assert (attach.name, attach.handle, attach.role) == ("pl-link", 0, ROLE_SENDER)
    assert attach.source is not None and attach.source.address == "from-here"
    assert attach.target is not None and attach.target.address == "to-there"
    assert attach.initial_delivery_count == 0

    # Our answers, as our encoder writes them, drive Proton's state machine.
    peer.send(
        Open(container_id="pairlink", max_frame_size=16384, channel_max=9, idle_time_out=4000,
             offered_capabilities=[S("x-cap")], properties={S("k"): ULong(1)}),
        Begin(remote_channel=0, next_outgoing_id=0, incoming_window=100, outgoing_window=100),
        Attach(name="pl-link", handle=7, role=ROLE_RECEIVER, source=Source(address="from-here"),
               target=Target(address="to-there", capabilities=[S("queue")]), max_message_size=4096),
        Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=0, outgoing_window=100,
             handle=7, delivery_count=0, link_credit=10),
        raw=AMQP_HEADER,
    )  # fmt: skip
    assert conn.remote_container == "pairlink"
    assert transport.remote_max_frame_size == 16384
    assert transport.remote_channel_max == 9
    assert transport.remote_idle_timeout == 4.0
    assert conn.remote_offered_capabilities == [S("x-cap")]
    assert conn.remote_properties == {S("k"): 1}
    assert snd.remote_target.address == "to-there"
    assert snd.remote_max_message_size == 4096
    assert snd.credit == 10

    dlv = snd.delivery(b"tag-1")  # type: ignore[arg-type]  # Proton takes bytes tags too
    snd.send(b"message bytes")
    snd.advance()
    (frame,) = peer.frames()
    transfer = frame.performative
    assert isinstance(transfer, Transfer)
    assert (transfer.handle, transfer.delivery_id, transfer.delivery_tag) == (0, 0, b"tag-1")
    assert transfer.message_format == 0 and not transfer.more and not transfer.settled
    assert bytes(frame.payload) == b"message bytes"

    peer.send(Disposition(role=ROLE_RECEIVER, first=0, settled=True, state=Rejected(error=ERR)))
    assert dlv.remote_state == proton.Delivery.REJECTED and dlv.settled
    condition = dlv.remote.condition
    assert condition is not None
    assert (condition.name, condition.description) == ("amqp:link:stolen", "taken")

    snd.condition = proton.Condition("amqp:not-allowed", "no more", {proton.symbol("n"): 1})
    snd.close()
    ssn.close()
    conn.condition = proton.Condition("amqp:connection:forced", "bye")
    conn.close()
    *_, detach, end, close = _performatives(peer.frames())
    assert detach == Detach(handle=0, closed=True, error=Error(
        condition="amqp:not-allowed", description="no more", info={S("n"): 1}))  # fmt: skip
    assert end == End()
    assert close == Close(error=Error(condition="amqp:connection:forced", description="bye"))


def test_proton_receiver_sees_our_sender() -> None:
    conn = proton.Connection()
    transport = proton.Transport()
    transport.bind(conn)
    peer = ProtonEnd(transport)
    conn.open()
    ssn = conn.session()
    ssn.open()
    rcv = ssn.receiver("in")
    rcv.source.address = "src"
    rcv.open()
    rcv.flow(5)
    assert isinstance(_performatives(peer.frames())[-1], Flow)

    source = Source(address="src", durable=DURABLE_UNSETTLED_STATE, expiry_policy=EXPIRY_NEVER,
                    timeout=30, distribution_mode=DIST_COPY,
                    default_outcome=Released(), outcomes=[S("amqp:accepted:list")],
                    capabilities=[S("queue")])  # fmt: skip
    peer.send(
        Open(container_id="us"),
        Begin(remote_channel=0, next_outgoing_id=0, incoming_window=10, outgoing_window=10),
        Attach(name="in", handle=0, role=ROLE_SENDER, source=source, target=Target(),
               initial_delivery_count=0),
        (Transfer(handle=0, delivery_id=0, delivery_tag=b"d0", message_format=0, more=True),
         b"first half "),
        (Transfer(handle=0), b"second half"),
        raw=AMQP_HEADER,
    )  # fmt: skip
    rs = rcv.remote_source
    assert rs.address == "src"
    assert rs.durability == proton.Terminus.DELIVERIES
    assert rs.expiry_policy == proton.Terminus.EXPIRE_NEVER
    assert rs.timeout == 30
    assert rs.distribution_mode == proton.Terminus.DIST_MODE_COPY
    rs.capabilities.rewind()
    rs.capabilities.next()
    assert list(rs.capabilities.get_object()) == ["queue"]
    dlv = rcv.current
    assert dlv is not None and dlv.tag == "d0" and not dlv.partial  # Proton decodes tags
    assert rcv.recv(100) == b"first half second half"
    dlv.update(proton.Delivery.ACCEPTED)
    dlv.settle()
    disposition = _performatives(peer.frames())[-1]
    assert isinstance(disposition, Disposition)
    assert disposition.role == ROLE_RECEIVER and disposition.first == 0
    assert disposition.last in (None, 0) and disposition.settled
    assert disposition.state == Accepted()

    # A second delivery, sent settled=False, which Proton's receiver modifies (not settling).
    rcv.advance()
    peer.send((Transfer(handle=0, delivery_id=1, delivery_tag=b"d1", settled=False), b"m"))
    dlv = rcv.current
    assert dlv is not None and rcv.recv(10) == b"m"
    dlv.local.failed = True
    dlv.local.undeliverable = True
    dlv.local.annotations = {proton.symbol("x-opt-why"): "busy"}
    dlv.update(proton.Delivery.MODIFIED)
    disposition = _performatives(peer.frames())[-1]
    assert isinstance(disposition, Disposition) and disposition.first == 1
    assert not disposition.settled
    assert disposition.state == Modified(True, True, {S("x-opt-why"): "busy"})

    peer.send(Detach(handle=0, closed=True, error=ERR), End(error=ERR), Close(error=ERR))
    for endpoint in (rcv, ssn, conn):
        condition = endpoint.remote_condition
        assert condition is not None
        assert (condition.name, condition.info) == ("amqp:link:stolen", {S("by"): "x"})


def test_proton_sasl_server_accepts_our_init() -> None:
    transport = proton.Transport(proton.Transport.SERVER)
    sasl = transport.sasl()
    sasl.allowed_mechs("ANONYMOUS")
    conn = proton.Connection()
    transport.bind(conn)
    peer = ProtonEnd(transport)
    peer.send(SaslInit(mechanism="ANONYMOUS", initial_response=b"trace", hostname="h"),
              frame_type=FRAME_SASL, raw=SASL_HEADER)  # fmt: skip
    frames = peer.frames()
    assert frames[0].performative == SASL_HEADER
    mechs, outcome = _performatives(frames[1:3])
    assert all(f.type == FRAME_SASL for f in frames[1:3])
    assert mechs == SaslMechanisms(sasl_server_mechanisms=[S("ANONYMOUS")])
    assert outcome == SaslOutcome(code=SASL_OK)
    assert sasl.outcome == proton.SASL.OK


def test_proton_sasl_client_follows_our_server() -> None:
    transport = proton.Transport()
    sasl = transport.sasl()
    sasl.allowed_mechs("ANONYMOUS")
    conn = proton.Connection()
    conn.container = "c"
    transport.bind(conn)
    conn.open()
    peer = ProtonEnd(transport)
    assert _performatives(peer.frames()) == [SASL_HEADER]
    peer.send(SaslMechanisms(sasl_server_mechanisms=[S("PLAIN"), S("ANONYMOUS")]),
              frame_type=FRAME_SASL, raw=SASL_HEADER)  # fmt: skip
    (init,) = _performatives(peer.frames())
    assert isinstance(init, SaslInit) and init.mechanism == "ANONYMOUS"
    peer.send(SaslOutcome(code=SASL_OK, additional_data=b"welcome"), frame_type=FRAME_SASL)
    assert sasl.outcome == proton.SASL.OK
    peer.expect_header = True
    header, op = _performatives(peer.frames())[:2]
    assert header == AMQP_HEADER and isinstance(op, Open) and op.container_id == "c"
