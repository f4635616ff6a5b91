"""A DNS server on loopback (dnslib) whose answers a test controls, including rebinding."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dnslib import AAAA, QTYPE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class Zone(BaseResolver):  # type: ignore[misc]
    """name -> list of answer sets; each query of a name takes the next set (the last one
    repeats), so ``["1.2.3.4"], ["127.0.0.1"]`` answers public first, loopback after."""

    def __init__(self) -> None:
        self.records: dict[str, list[list[str]]] = {}
        self.queries: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def set(self, name: str, *answer_sets: list[str]) -> None:
        self.records[name.rstrip(".").lower()] = [list(a) for a in answer_sets]

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        qname = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        with self._lock:
            sets = self.records.get(qname)
            if sets is None:
                return reply
            index = self.queries[f"{qname}/{qtype}"]
            self.queries[f"{qname}/{qtype}"] += 1
            answers = sets[min(index, len(sets) - 1)]
        for address in answers:
            if qtype == "A" and ":" not in address:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=0))
            elif qtype == "AAAA" and ":" in address:
                reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=0))
        return reply


@contextmanager
def dns_server() -> Iterator[tuple[Zone, str]]:
    zone = Zone()
    server = DNSServer(
        zone,
        port=0,
        address="127.0.0.1",
        logger=DNSLogger(log="-request,-reply,-truncated,-error", prefix=False),
    )
    server.start_thread()
    try:
        yield zone, f"127.0.0.1:{server.server.server_address[1]}"
    finally:
        server.stop()
        server.server.server_close()
