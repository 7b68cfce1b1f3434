"""The README's examples run as written (only the server's address is replaced by a local
fault server's), so they cannot rot."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from faultserver import FaultServer, Step

README = Path(__file__).resolve().parents[1] / "README.md"
ADDRESS = "http://127.0.0.1:8080"


def blocks(section: str) -> List[str]:
    """The ```python blocks of one ``## section`` of the README, in order."""
    text = README.read_text("utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else len(text)]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_quick_start_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    quick = blocks("Quick start")
    assert len(quick) == 3
    # The setup is two lines.
    assert len(quick[0].strip().splitlines()) == 2
    payment = json.dumps({"id": "pay_1", "status": "succeeded"}).encode()
    steps = (
        Step(503, {"retry-after": "0"}),
        Step(201, {"content-type": "application/json"}, payment),
        Step(200, {"content-type": "application/json"}, payment),
    )
    with FaultServer(*steps) as server:
        namespace: Dict[str, Any] = {"__name__": "readme"}
        for code in quick:
            assert ADDRESS in code or "import" in code
            exec(compile(code.replace(ADDRESS, server.url), str(README), "exec"), namespace)
        namespace["client"].close()
        out = capsys.readouterr().out.splitlines()
        assert out == ["201 {'id': 'pay_1', 'status': 'succeeded'}", "200"]
        posts = [s for s in server.seen if s.method == "POST"]
        assert len(posts) == 2
        assert [s.headers["idempotency-key"] for s in posts] == ["order-confirm-42"] * 2
        assert posts[0].body == posts[1].body == b'{"amount":1000,"currency":"EUR"}'


def test_quick_start_error_branch_reports_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The same block against a server that resets every connection after reading the request:
    the keyed POST is retried, then the attempts run out and the error branch prints."""
    quick = blocks("Quick start")
    with FaultServer(Step(fault="reset")) as server:
        namespace: Dict[str, Any] = {"__name__": "readme"}
        for code in quick[:2]:
            exec(compile(code.replace(ADDRESS, server.url), str(README), "exec"), namespace)
        namespace["client"].close()
    out = capsys.readouterr().out.strip()
    assert out == "gave up after 3 attempts (attempts_exhausted, last status None)"
    assert len(server.seen) == 3


def test_policy_example_runs() -> None:
    (code,) = blocks("The defaults")
    namespace: Dict[str, Any] = {}
    exec("import httpx, oncely\n" + code, namespace)
    policy = namespace["policy"]
    assert (policy.max_attempts, policy.deadline, policy.attempt_timeout) == (4, 10.0, 2.0)
    namespace["client"].close()
