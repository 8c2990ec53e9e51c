"""What the tests share, imported as a package (``from tests.helpers.otlp_receiver import HttpReceiver``; pytest puts
the repository root on ``sys.path``, see pyproject's ``pythonpath``): loopback OTLP receivers and their decoding
(:mod:`.otlp_receiver`), the private Jaeger's configuration (:mod:`.jaeger_config`), rule-test shortcuts
(:mod:`.checks_util`), a demo run and the ``check`` command in-process (:mod:`.demo_run`), fake Jaeger and Tempo
query services (:mod:`.jaeger_fixtures`, :mod:`.tempo_fixtures`), the real services of the integration tests
(:mod:`.integration`) and the browser (:mod:`.browser`). The benchmarks in ``bench/`` use some of them too.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
