"""A peer's refusal that gRPC garbles into INTERNAL does not get the peer released.

Under load gRPC can end a call the peer refused (INVALID_ARGUMENT) with INTERNAL
("Internal error from Core") while the sender is still sending. Reported as a failed
link, it made the coordinator release the honest receiver and keep the sender that
pushed the wrong shape (tests/e2e/test_topologies.py, 1 run in 7 here). The sender now
waits a moment for a clean answer from the same peer before it reports the link.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from codedgd.services.security import Security
from codedgd.services.worker import peers
from codedgd.services.worker.peers import PEER_SERVICE, GrpcPeerLinks


async def _server(codes: list[grpc.StatusCode]) -> tuple[grpc.aio.Server, int, list[int]]:
    """A Peer service whose n-th Push call ends with ``codes[n]`` (the last one after)."""
    calls: list[int] = []

    async def push(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        calls.append(1)
        async for _ in requests:
            break
        code = codes[min(len(calls), len(codes)) - 1]
        await context.abort(
            code, "Internal error from Core" if code.name == "INTERNAL" else "shape"
        )
        return b""  # pragma: no cover - abort raises

    server = grpc.aio.server()
    handler = grpc.stream_unary_rpc_method_handler(push)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(PEER_SERVICE, {"Push": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port, calls


async def _push_twice(
    codes: list[grpc.StatusCode], grace: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[str], int]:
    monkeypatch.setattr(peers, "AMBIGUOUS_GRACE_SECONDS", grace)
    server, port, calls = await _server(codes)
    failed: list[str] = []
    refused: list[str] = []
    links = GrpcPeerLinks(
        {1: f"127.0.0.1:{port}"},
        "credential",
        Security(),
        on_failure=lambda peer, address, why: failed.append(why),
        on_refused=lambda peer, why: refused.append(why),
    )
    try:
        links.send(1, [b"frame"])
        for _ in range(200):  # the first call ends
            await asyncio.sleep(0.01)
            if 1 not in links._calls:
                break
        links.send(1, [b"frame"])  # the next frames open a new call
        await asyncio.sleep(grace + 0.5)
    finally:
        await links.close()
        await server.stop(0)
    return failed, refused, len(calls)


@pytest.mark.parametrize(
    "codes",
    [
        [grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT],  # garbled, then clean
        [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL],  # clean, then garbled
    ],
    ids=["garbled-then-clean", "clean-then-garbled"],
)
async def test_a_refusal_garbled_on_either_call_is_a_refusal_not_a_failed_link(
    codes: list[grpc.StatusCode], monkeypatch: pytest.MonkeyPatch
) -> None:
    failed, refused, calls = await _push_twice(codes, 1.0, monkeypatch)
    assert calls == 2
    assert failed == []
    assert refused == ["worker 1 refused this worker's pushes: shape"]


async def test_an_internal_end_that_nothing_explains_is_a_failed_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed, refused, _ = await _push_twice([grpc.StatusCode.INTERNAL], 0.2, monkeypatch)
    assert refused == []
    assert len(failed) == 1 and "failed: INTERNAL" in failed[0]  # once, after the grace


async def test_a_failed_link_names_the_address_it_dialled_and_a_new_holder_ends_the_doubt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report names the address, so the coordinator can tell a former holder's link
    from the newcomer's; an INTERNAL end still in doubt when the peer gets a new holder
    (PeerUpdate) is about the former holder, and is never reported."""
    monkeypatch.setattr(peers, "AMBIGUOUS_GRACE_SECONDS", 0.3)
    server, port, _ = await _server([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL])
    failed: list[tuple[int, str]] = []
    old = f"127.0.0.1:{port}"
    links = GrpcPeerLinks(
        {1: old},
        "credential",
        Security(),
        on_failure=lambda peer, address, why: failed.append((peer, address)),
        on_refused=lambda peer, why: None,
    )
    try:
        links.send(1, [b"frame"])
        for _ in range(200):
            await asyncio.sleep(0.01)
            if failed:
                break
        assert failed == [(1, old)]
        links.send(1, [b"frame"])  # the second call ends INTERNAL: in doubt for 0.3 s
        for _ in range(200):
            await asyncio.sleep(0.01)
            if 1 in links._ambiguous:
                break
        assert 1 in links._ambiguous
        links.update({1: "127.0.0.1:9"})  # a newcomer holds place 1 now
        await asyncio.sleep(0.6)
        assert failed == [(1, old)]
    finally:
        await links.close()
        await server.stop(0)
