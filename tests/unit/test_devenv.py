"""The development environment leaves nothing behind: its TLS files live as long as the
process that made them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MAKE = ("from notiflow.devenv import dev_environment; "
        "env, _ = dev_environment(api_port=1, fakes_port=2); "
        "import pathlib; d = pathlib.Path(env['NOTIFLOW_APNS__CA_FILE']).parent; "
        "assert d.is_dir() and any(d.iterdir()); print(d)")


def test_the_tls_directory_goes_when_its_process_exits() -> None:
    out = subprocess.run([sys.executable, "-c", MAKE], check=True, capture_output=True,
                         text=True).stdout
    made = Path(out.strip())
    assert made.name.startswith("notiflow-tls-")
    assert not made.exists()
