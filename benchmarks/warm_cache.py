"""Warm remote cache: a fresh checkout, in a new directory on a "new machine" (empty local
cache), builds the examples against a remote cache another machine filled.

The cold build compiles every unit (the fake neuronx-cc burns COMPILE_SECONDS of CPU per
compile, NKIBUILD_FAKE_CC_CPU_SECONDS) and publishes to the remote; the warm build must
then run the compiler 0 times (counted with NKIBUILD_FAKE_CC_COUNTER). The remote is a
file:// URL by default; `--s3` uses a real S3 API instead (moto's server on localhost,
as the tests do), and any other argument is taken as the remote's fsspec URL.
The last line is a JSON object; `ratio` = warm / cold build time (target <= 1.0),
`compiler_invocations` = compiles in the warm build (must be 0).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COMPILE_SECONDS = 1.0


def checkout(destination: Path) -> Path:
    shutil.copytree(
        EXAMPLES, destination, ignore=shutil.ignore_patterns("build", "dist", "__pycache__")
    )
    return destination


def timed_build(root: Path, env: dict[str, str], remote: str) -> float:
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "-j", "2"]
    started = time.perf_counter()
    proc = subprocess.run(
        [*command, "--remote-cache", remote], cwd=root, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"build in {root} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def invocations(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@contextlib.contextmanager
def local_s3() -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on moto's S3 server on localhost, and the environment that reaches it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="bench", aws_secret_access_key="bench").create_bucket(
        Bucket="bench"
    )  # fmt: skip
    try:
        yield "s3://bench/nkibuild-cache", env
    finally:
        server.stop()


def main() -> None:
    argument = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        base = Path(scratch)
        if argument == "--s3":
            with local_s3() as (remote, s3_env):
                run(base, remote, s3_env)
        else:
            run(base, argument or (base / "remote").as_uri(), {})


def run(base: Path, remote: str, extra_env: dict[str, str]) -> None:
    env = {
        **os.environ,
        **extra_env,
        "CI": "true",
        "NKIBUILD_FAKE_CC_CPU_SECONDS": str(COMPILE_SECONDS),
    }
    machines = []
    for name in ("machine-a", "machine-b"):
        counter = base / f"{name}.compiles"
        machine_env = {
            **env,
            "NKIBUILD_CACHE_DIR": str(base / name / "local-cache"),
            "NKIBUILD_FAKE_CC_COUNTER": str(counter),
        }
        machines.append((checkout(base / name / "src" / "kernels-repo"), machine_env, counter))
    (cold_root, cold_env, cold_counter), (warm_root, warm_env, warm_counter) = machines
    cold = timed_build(cold_root, cold_env, remote)
    warm = timed_build(warm_root, warm_env, remote)
    cold_compiles, warm_compiles = invocations(cold_counter), invocations(warm_counter)
    wheels = [sorted((root / "dist").glob("*.whl")) for root in (cold_root, warm_root)]
    identical = all(
        a.name == b.name and a.read_bytes() == b.read_bytes() for a, b in zip(*wheels, strict=True)
    )
    print(f"remote cache: {remote}")
    print(f"cold build (machine A, empty caches): {cold:.2f} s, {cold_compiles} compiles")
    print(
        f"warm build (machine B, fresh checkout elsewhere): {warm:.2f} s, {warm_compiles} compiles"
    )
    print(f"wheels byte-identical: {identical}")
    result = {
        "benchmark": "warm_cache",
        "ratio": round(warm / cold, 3),
        "baseline": "cold build of the same examples on another machine, empty caches",
        "target": "<= 1.0",
        "compiler_invocations": warm_compiles,
        "compiler_invocations_target": 0,
        "cold_compiles": cold_compiles,
        "cold_s": round(cold, 2),
        "warm_s": round(warm, 2),
        "wheels_identical": identical,
    }
    print(json.dumps(result))
    if warm_compiles:
        sys.exit("the warm build ran the compiler")


if __name__ == "__main__":
    main()
