"""Fuzz: seeded hostile command lines and API payloads (``tests/hostile.py``). No traceback, no generic error: each
case either runs or ends in one clear message; cases without a bad value must run. Most cases run in this process
(bounded time); a small sample runs as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import hostile
from xpress_app.chat import run_chat
from xpress_app.config import AppConfig
from xpress_app.models import ModelCache
from xpress_app.settings import Settings
from xpress_app.texts import EMPTY_MESSAGE
from xpress_core import cli
from xpress_core.errors import XpressError
from xpress_core.models import encode_prompt, load_models
from xpress_core.presets import ModelPreset

ROOT = Path(__file__).resolve().parent.parent
CLI_CASES = 240  # in process; with the payloads below, well over 300 cases in CI
CLI_SUBPROCESS_CASES = 2


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
            [sys.executable, "-m", "xpress_core", "generate", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        check_outcome(case, proc.returncode, proc.stderr.decode("utf-8", "replace"), f"subprocess {i}")


API_CASES = 120
TINY = "tiny"


@pytest.fixture(scope="module")
def tiny_cache(zoo):
    return ModelCache(
        AppConfig(presets=(ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),), device="cpu")
    )


def test_fuzz_api_in_process(zoo, tiny_cache):
    """The chat handler's body (``run_chat``: what /chat runs, its XpressError becoming the gr.Error the client reads)
    on hostile payloads: a reply or an XpressError, nothing else; then a normal greedy request equals generate."""
    start, ran, refused = time.perf_counter(), 0, 0
    for i, p in enumerate(hostile.payloads(seed=14, count=API_CASES, presets=(TINY,))):
        settings = Settings(preset=p.preset, **p.settings)
        try:
            views = list(run_chat(tiny_cache, p.message, p.history, settings))
        except XpressError as error:
            assert str(error) and p.hostile, f"payload {i}: a valid payload was refused: {error}\n{p!r:.300}"
            refused += 1
            continue
        except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"payload {i} raised {type(error).__name__}: {error!r:.300}\n{p!r:.400}")
        assert views and (views[-1].done or views[-1].status == EMPTY_MESSAGE), f"payload {i}: {p!r:.300}"
        ran += 1
    print(f"{API_CASES} payloads in process in {time.perf_counter() - start:.1f} s: {ran} answered, {refused} refused")
    assert ran >= 10 and refused >= 40
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    views = list(run_chat(tiny_cache, "book a table", [], Settings(preset=TINY, max_new_tokens=16)))
    prompt = encode_prompt(models.tokenizer, "book a table", chat=True)
    ref = models.target.generate(prompt, max_new_tokens=16, do_sample=False)[0, prompt.shape[1] :]
    assert list(views[-1].reply.result.token_ids) == ref.tolist()


SERVER_CASES = 12


def json_compliant(value) -> bool:
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError:  # UnicodeEncodeError (lone surrogates) is one too
        return False
    return True


GENERIC = "upstream Gradio app has raised an exception"


def test_fuzz_api_server_sample(zoo, tmp_path):
    """A real server (``python app.py``) with its own temporary folder: hostile payloads through gradio_client get
    a reply or a clear message; a 1 MB history is answered; uploads are capped; a normal request still equals the
    engine's reply; and once the server stops, no file is left in its temporary folder."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from tests.app_server import serve_app, zoo_env
    from tests.test_app_server import engine_text, reply_text, request
    from xpress_app.config import CUSTOM_PRESET

    temp = tmp_path / "server-tmp"
    temp.mkdir()
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    with serve_app({**zoo_env(zoo), "TMPDIR": str(temp)}, "app-fuzz") as url:
        client = Client(url, verbose=False)
        for i, p in enumerate(hostile.payloads(seed=141, count=SERVER_CASES, presets=(CUSTOM_PRESET,))):
            args = {**request(p.message), **p.settings, "history": p.history, "preset": p.preset}
            if not json_compliant(
                args
            ):  # NaN, infinities, lone surrogates: gradio_client cannot send them; in process they are
                continue
            try:
                client.predict(api_name="/chat", **args)
            except AppError as error:
                assert str(error) and GENERIC not in str(error) and p.hostile, f"payload {i}: {error}\n{p!r:.300}"
        big = [
            {"role": "user", "content": " ".join(["word"] * 100)},
            {"role": "assistant", "content": " ".join(["reply"] * 100)},
        ] * 1000
        started = time.perf_counter()
        outputs = client.predict(api_name="/chat", **request("hello", history=big, max_new_tokens=8))
        print(f"a {len(json.dumps(big))}-byte history answered in {time.perf_counter() - started:.2f} s")
        assert "the chat keeps its last" in outputs[2] and "✓" in outputs[2]
        upload = urllib.request.Request(
            url + "gradio_api/upload",
            data=b'--b\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n\r\n'
            + b"0" * 200_000
            + b"\r\n--b--\r\n",
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
        with pytest.raises(urllib.error.HTTPError, match="413"):
            urllib.request.urlopen(upload, timeout=30)
        assert reply_text(client.predict(api_name="/chat", **request("hello"))) == engine_text(models, request("hello"))
        assert any(temp.rglob("xpress-rounds-*.jsonl"))  # the replies' logs, while serving
    left = [path for path in temp.rglob("*") if path.is_file()]
    assert not left, f"left behind in the temporary folder: {left}"


SWEEP_CASES = 40


def test_fuzz_sweep_in_process(tiny_cache):
    """The sweep handler's body (``run_sweep``) on hostile payloads, 2 MB chat boxes among them: a sweep or an
    XpressError, nothing else; the valid 2 MB ones are fitted and measured."""
    from xpress_app.sweep import SweepRequest, run_sweep

    start, ran, refused = time.perf_counter(), 0, 0
    for i, p in enumerate(hostile.sweep_payloads(seed=33, count=SWEEP_CASES, presets=(TINY,))):
        try:
            view = run_sweep(tiny_cache, SweepRequest(preset=p.preset, **p.fields), p.message)
        except XpressError as error:
            assert str(error) and p.hostile, f"sweep payload {i}: a valid payload was refused: {error}\n{p!r:.300}"
            refused += 1
            continue
        except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"sweep payload {i} raised {type(error).__name__}: {error!r:.300}\n{p!r:.300}")
        assert view.run is not None and view.run.mismatches == (), f"sweep payload {i}: {view.status}"
        if p.message == hostile.TWO_MB and p.fields["source"] == "the chat box text":
            assert "your message was cut to its last" in view.status
        ran += 1
    print(f"{SWEEP_CASES} sweep payloads in {time.perf_counter() - start:.1f} s: {ran} ran, {refused} refused")
    assert ran >= 5 and refused >= 10


RAW_CASES = 60


def test_fuzz_raw_routes_server(zoo):
    """Raw HTTP to Gradio's routes (odd bodies, unknown fn_index values, made-up event ids and sessions): never a
    5xx, no traceback in the server's log, and the server still answers a chat."""
    from gradio_client import Client

    from tests.app_server import OUTPUT, serve_app, zoo_env
    from tests.test_app_server import reply_text, request

    statuses = {}
    with serve_app(zoo_env(zoo), "app-fuzz-raw") as url:
        for i, raw in enumerate(hostile.raw_requests(seed=33, count=RAW_CASES)):
            call = urllib.request.Request(
                url + "gradio_api/" + raw.path, data=raw.body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(call, timeout=60) as response:
                    status = response.status
                    response.read()
            except urllib.error.HTTPError as error:
                status = error.code
            assert status < 500, f"raw request {i}: {status} for {raw!r:.300}"
            statuses[status] = statuses.get(status, 0) + 1
        assert reply_text(Client(url, verbose=False).predict(api_name="/chat", **request("hello")))
    print(f"{RAW_CASES} raw requests: {dict(sorted(statuses.items()))}")
    log = (OUTPUT / "app-fuzz-raw.log").read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log
