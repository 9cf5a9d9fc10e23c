"""Fuzz: seeded hostile command lines and API payloads (``tests/hostile.py``). No traceback, no generic error: each
case either runs or ends in one clear message; cases without a bad value must run. Most cases run in this process
(bounded time); a small sample runs as real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import hostile
from xpress_core import cli

ROOT = Path(__file__).resolve().parent.parent
CLI_CASES = 240  # in process; with the payloads below, well over 300 cases in CI
CLI_SUBPROCESS_CASES = 6


def placeholders(argv: tuple[str, ...], zoo, tmp: Path) -> list[str]:
    paths = {"TARGET": str(zoo["llama"]), "DRAFTER": str(zoo["drafter_llama"]), "TMP": str(tmp)}
    return [paths.get(a, a.replace("TMP/", f"{tmp}/")) for a in argv]


def check_outcome(case: hostile.CliCase, code, err: str, where: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err, f"{where}: {case.argv!r}\n{err}"
    if not case.hostile:
        assert code == 0, f"{where}: a valid command line failed: {case.argv!r}\n{err}"
    assert code in (0, 2), f"{where}: exit code {code}: {case.argv!r}\n{err}"
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: not one error line: {case.argv!r}\n{err}"


def test_fuzz_cli_in_process(zoo, tmp_path, capsys):
    start, outcomes = time.perf_counter(), {0: 0, 2: 0}
    for i, case in enumerate(hostile.cli_cases(seed=14, count=CLI_CASES)):
        argv = placeholders(case.argv, zoo, tmp_path)
        try:
            code = cli.main(["generate", *argv])
        except SystemExit as stop:
            code = stop.code
        except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"case {i} raised {type(error).__name__}: {error!r:.300}\n{case.argv!r:.300}")
        captured = capsys.readouterr()
        check_outcome(case, code, captured.err, f"case {i}")
        outcomes[code] += 1
    print(f"{CLI_CASES} CLI cases in {time.perf_counter() - start:.1f} s: {outcomes[0]} ran, {outcomes[2]} refused")
    assert outcomes[0] >= 10 and outcomes[2] >= 100  # both paths were exercised


def test_fuzz_cli_subprocess_sample(zoo, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # a real command line cannot hold a NUL byte: those cases run in process only
    cases = [c for c in hostile.cli_cases(seed=1414, count=4 * CLI_SUBPROCESS_CASES) if "\0" not in "".join(c.argv)]
    for i, case in enumerate(cases[:CLI_SUBPROCESS_CASES]):
        argv = [a.encode("utf-8", "surrogateescape") for a in placeholders(case.argv, zoo, tmp_path)]
        proc = subprocess.run(
            [sys.executable, "-m", "xpress_core", "generate", *argv], cwd=ROOT, env=env, capture_output=True, timeout=300
        )
        check_outcome(case, proc.returncode, proc.stderr.decode("utf-8", "replace"), f"subprocess {i}")
