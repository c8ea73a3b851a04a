"""The ports module loads no driver and no implementation: a flow built on the memory ports
reads its contracts without Redis, Cassandra, Kafka or HTTP client code behind them."""

from __future__ import annotations

import json
import subprocess
import sys

DRIVERS = ("redis", "cassandra", "confluent_kafka", "aiohttp", "httpx", "pyreqwest",
           "aiosmtplib")
VALUE_MODULES = {
    "notiflow.adapters", "notiflow.adapters.ports", "notiflow.adapters.rows",
    "notiflow.adapters.breaker", "notiflow.adapters.breaker.model",
    "notiflow.adapters.providers", "notiflow.adapters.providers.base",
}
"""The adapters modules the ports may load: value types and the breaker's pure model."""


def _loaded_by(module: str) -> list[str]:
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def test_the_ports_load_no_driver_and_no_implementation() -> None:
    loaded = _loaded_by("notiflow.adapters.ports")
    drivers = [m for m in loaded if m.split(".")[0] in DRIVERS]
    adapters = {m for m in loaded if m.startswith("notiflow.adapters")}
    assert drivers == []
    assert adapters <= VALUE_MODULES, sorted(adapters - VALUE_MODULES)


def test_the_check_sees_a_driver_an_implementation_loads() -> None:
    loaded = _loaded_by("notiflow.adapters.cancel_gate")
    assert "redis" in loaded
    assert "notiflow.adapters.cancel_gate" not in VALUE_MODULES
