"""WebSocket messages framed by t3d (ws_frames.py) and written through `PrefixedStream`.

The frames are checked by a real client-side wsproto; the stream's writes go over a
real socket pair, with a reader slow enough that the kernel takes only part of a write.
"""

from __future__ import annotations

import trio
import trio.lowlevel
import trio_websocket
from wsproto.frame_protocol import FrameProtocol, Opcode

from t3d.api.prefixed_stream import PrefixedStream
from t3d.api.ws_frames import MessageWriter, encode_messages, frame_header


def _client_frames(data: bytes) -> list[tuple[Opcode, bytes, bool]]:
    protocol = FrameProtocol(client=True, extensions=[])
    protocol.receive_bytes(data)
    return [(f.opcode, bytes(f.payload.encode() if isinstance(f.payload, str) else f.payload), f.message_finished) for f in protocol.received_frames()]


def test_messages_of_every_length_class_decode_as_the_same_text_messages() -> None:
    """Payloads of 0, 125, 126, 65,535 and 65,536+ bytes (the three length encodings and
    their edges), framed in one buffer, come out of a client's wsproto as one whole text
    message each, in order, byte for byte."""
    payloads = [b"", b"a" * 125, b"b" * 126, b"c" * 65535, b"d" * 65536, b'{"x":"\xc3\xa9"}' * 9000]
    frames = _client_frames(encode_messages(payloads))
    assert [opcode for opcode, _, _ in frames] == [Opcode.TEXT] * len(payloads)
    assert [payload for _, payload, _ in frames] == payloads
    assert all(finished for _, _, finished in frames)
    assert len(frame_header(125)) == 2 and len(frame_header(126)) == 4 and len(frame_header(1 << 16)) == 10


async def test_writes_from_many_tasks_never_interleave_even_when_the_kernel_takes_part() -> None:
    """Several tasks each send a large buffer at once while the peer reads slowly: every
    buffer arrives whole and contiguous (the stream serializes writes, and the rest of a
    partial write goes out before anyone else's)."""
    left, right = trio.socket.socketpair()
    writer = PrefixedStream(b"", trio.SocketStream(left), send_timeout_s=30)
    reader = trio.SocketStream(right)
    blocks = [bytes([65 + i]) * (300_000 + i) for i in range(5)]
    received = bytearray()

    async def read_slowly() -> None:
        while len(received) < sum(map(len, blocks)):
            received.extend(await reader.receive_some(16384))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_slowly)
        async with trio.open_nursery() as senders:
            for block in blocks:
                senders.start_soon(writer.send_all, block)
    runs = []
    for byte in received:
        if not runs or runs[-1][0] != byte:
            runs.append([byte, 0])
        runs[-1][1] += 1
    assert sorted((chr(b), n) for b, n in runs) == [(chr(block[0]), len(block)) for block in blocks]
    await writer.aclose()
    await reader.aclose()


async def test_a_closing_websocket_takes_no_more_messages() -> None:
    """Once the close handshake has begun (the server's ws has a close reason), a send
    raises ConnectionClosed and writes nothing more; before it, the messages of one send
    reach a trio-websocket client as separate messages, in order."""
    left, right = trio.socket.socketpair()
    server_stream = PrefixedStream(b"", trio.SocketStream(left), send_timeout_s=30)
    client_stream = trio.SocketStream(right)
    async with trio.open_nursery() as inner:
        client_future: list[trio_websocket.WebSocketConnection] = []

        async def connect() -> None:
            client_future.append(await trio_websocket.wrap_client_stream(inner, client_stream, "localhost", "/ws"))

        inner.start_soon(connect)
        proposal = await trio_websocket.wrap_server_stream(inner, server_stream)
        ws = await proposal.accept()
        while not client_future:  # noqa: ASYNC110 (trio-websocket's handshake has no event)
            await trio.sleep(0.01)
        client = client_future[0]
        out = MessageWriter(ws, server_stream)
        await out.send([b'{"n":1}', b'{"n":2}', b'{"n":3}'])
        assert [await client.get_message() for _ in range(3)] == ['{"n":1}', '{"n":2}', '{"n":3}']
        await client.aclose()
        with trio.fail_after(10):
            while ws.closed is None:  # noqa: ASYNC110 (nor does its close)
                await trio.sleep(0.01)
        try:
            await out.send([b'{"n":4}'])
        except trio_websocket.ConnectionClosed:
            pass
        else:
            raise AssertionError("a send after the close began must raise ConnectionClosed")
        inner.cancel_scope.cancel()
