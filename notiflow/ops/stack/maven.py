"""The Kafka and Cassandra jars, fetched once from Maven Central into ``cache_dir``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from importlib import resources

from notiflow.ops.stack.base import Paths, StackError
from notiflow.settings import Settings


def fetch_jars(s: Settings, p: Paths, log: Callable[[str], None]) -> None:
    """Copy each of Kafka's and Cassandra's runtime jars (at the configured versions) into
    ``p.libs``; a directory marked ``.complete`` is not fetched again."""
    for name, version in (("kafka", s.kafka_version), ("cassandra", s.cassandra_version)):
        target = p.libs(name, version)
        if (target / ".complete").exists():
            continue
        mvn = shutil.which("mvn")
        if not mvn:
            raise StackError("Maven (mvn) not found: apt-get install maven")
        log(f"fetching {name} {version} jars from Maven Central into {target} ...")
        target.mkdir(parents=True, exist_ok=True)
        pom_text = (resources.files("notiflow.ops") / "maven" / f"{name}-pom.xml").read_text()
        pom = target.parent / f"{name}-{version}-pom.xml"
        pom.write_text(pom_text.replace("@VERSION@", version))
        cmd = [mvn, "-B", "-q", "-f", str(pom),
               "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={target}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise StackError(f"mvn failed for {name}:\n{done.stdout[-3000:]}"
                             f"{done.stderr[-2000:]}")
        (target / ".complete").write_text(version)
