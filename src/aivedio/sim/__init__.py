"""A simulated AI-video provider: a loopback HTTP(S) server with injectable faults.

Used by the tests and the demo; never by the worker in production. ``provider`` holds the
server, ``tls`` a throwaway certificate authority (needs ``trustme``, a dev dependency).
"""
