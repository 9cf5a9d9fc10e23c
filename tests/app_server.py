"""Runs ``python app.py`` the way a user does (environment variables, a free port), for the server and browser tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"  # screenshots and server logs (gitignored)
STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zoo_env(zoo) -> dict[str, str]:
    """The app on the tiny models: the custom preset (first, so selected) is the llama target + diffusion drafter, in
    fp32 (a dtype timed at start could be either on a CPU with native bf16, and the tests compare with fp32 runs)."""
    return {
        "XPRESS_TARGET": str(zoo["llama"]),
        "XPRESS_DRAFTER": str(zoo["drafter_llama"]),
        "XPRESS_DEVICE": "cpu",
        "XPRESS_DTYPE": "float32",
    }


@contextmanager
def serve_app(env: dict[str, str], name: str) -> Iterator[str]:
    """Start ``python app.py --host 127.0.0.1 --port N`` with ``env`` on a free port N; yield its URL; stop it. Its
    output goes to test-output/."""
    port = free_port()
    OUTPUT.mkdir(exist_ok=True)
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        **env,
    }
    url = f"http://127.0.0.1:{port}/"
    with open(OUTPUT / f"{name}.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(url, process)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_serving(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with code {process.returncode}; see {OUTPUT}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"app.py did not serve {url} within {STARTUP_TIMEOUT_S} s")
