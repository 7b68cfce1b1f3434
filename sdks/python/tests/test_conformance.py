"""The Python runner of the language-neutral retry conformance suite (``conformance/retry/``).

It reads ``conformance/retry/scenarios.json`` (the format is ``conformance/retry/README.md``)
and runs every scenario: ``defaults`` and ``jitter`` against the SDK's policy and backoff, and
every ``http`` scenario through both :class:`oncely.RetryTransport` and
:class:`oncely.AsyncRetryTransport` against the Rust testbench (``oncely testbench``).

The testbench's URL is ``ONCELY_TESTBENCH_URL``. When it is unset the runner starts
``$ONCELY_BIN testbench`` (default ``target/debug/oncely``) itself if that binary exists and has
the subcommand, else the http scenarios are skipped with the reason; with
``ONCELY_CONFORMANCE_REQUIRED=1`` (what ``sdks/python/ci.sh`` sets) they fail instead.
``ONCELY_CONFORMANCE_SLACK_MS`` (default 250) is the tolerance added to upper time bounds.

A scenario that fails here is a bug in the SDK or in the scenario: never skip one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest

import oncely
from oncely import Backoff, BudgetConfig, CallOptions, RetryPolicy

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "conformance" / "retry" / "scenarios.json"
SLACK_MS = float(os.environ.get("ONCELY_CONFORMANCE_SLACK_MS", "250"))
LOW_MS = 5.0

# The fields the format defines (README, "Unknown fields are an error for a runner").
SCENARIO_FIELDS = {"id", "kind", "rule", "sources", "policy", "target", "distinct_keys", "calls", "expect", "draws", "retries"}
CALL_FIELDS = {"method", "path", "key", "body", "headers", "deadline_ms", "max_attempts", "layers", "repeat", "server", "expect"}
EXPECT_FIELDS = {"attempts", "key", "waits_ms", "total_wait_ms", "attempt_ms", "elapsed_ms", "result"}
RESULT_FIELDS = {"status", "body_json", "body_text", "headers", "error", "outcome_unknown", "attempts", "last_status", "key", "retry_after_ms"}
POLICY_FIELDS = {"max_attempts", "deadline_ms", "attempt_timeout_ms", "base_ms", "cap_ms", "retry_500", "mint_keys", "budget"}
BUDGET_FIELDS = {"capacity", "transient_cost", "throttle_cost", "success_refund"}


def _load() -> Dict[str, Any]:
    if not SCENARIOS.exists():
        return {"format": 1, "policy": {}, "scenarios": []}
    data: Dict[str, Any] = json.loads(SCENARIOS.read_text("utf-8"))
    return data


DATA = _load()
FILE_POLICY: Dict[str, Any] = DATA.get("policy") or {}
ALL = DATA.get("scenarios", [])
HTTP = [s for s in ALL if s.get("kind") == "http"]
OFFLINE = [s for s in ALL if s.get("kind") in ("defaults", "jitter")]

# Results, for the summary line the conftest prints: mode -> [passed, failed].
RESULTS: Dict[str, List[int]] = {"sync": [0, 0], "async": [0, 0], "offline": [0, 0]}


def test_the_file_is_format_1_and_every_scenario_is_known() -> None:
    assert SCENARIOS.exists(), f"{SCENARIOS} is missing"
    assert DATA["format"] == 1, "this runner reads format 1"
    assert set(DATA) <= {"$schema", "format", "policy", "scenarios"}
    ids = [s["id"] for s in ALL]
    assert len(ids) == len(set(ids)), "scenario ids must be unique"
    for s in ALL:
        assert s["kind"] in ("defaults", "jitter", "http"), s["id"]
        assert set(s) <= SCENARIO_FIELDS, (s["id"], set(s) - SCENARIO_FIELDS)
    print(f"\nconformance: {len(ALL)} scenarios in {SCENARIOS.relative_to(ROOT)} "
          f"({len(HTTP)} http, each through the sync and the async transport; {len(OFFLINE)} offline)")


# -- the testbench -----------------------------------------------------------------------------


@dataclass
class Bench:
    url: str
    refused_url: str


def _start_testbench() -> Tuple[Optional[subprocess.Popen[str]], str]:
    binary = Path(os.environ.get("ONCELY_BIN", str(ROOT / "target" / "debug" / "oncely")))
    if not binary.exists():
        return None, f"ONCELY_TESTBENCH_URL is unset and {binary} does not exist (cargo build -p oncely-cli)"
    probe = subprocess.run([str(binary), "testbench", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        return None, f"ONCELY_TESTBENCH_URL is unset and {binary} has no `testbench` subcommand"
    proc = subprocess.Popen(
        [str(binary), "testbench", "--addr", "127.0.0.1:0", "--scenarios", str(SCENARIOS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("http"):
        proc.kill()
        return None, f"{binary} testbench printed {line!r} instead of its URL"
    return proc, line


@pytest.fixture(scope="module")
def testbench() -> Iterator[Bench]:
    url = os.environ.get("ONCELY_TESTBENCH_URL")
    proc: Optional[subprocess.Popen[str]] = None
    if not url:
        proc, found = _start_testbench()
        if proc is None:
            if os.environ.get("ONCELY_CONFORMANCE_REQUIRED") == "1":
                pytest.fail(found)
            pytest.skip(found)
        url = found
    url = url.rstrip("/")
    info = httpx.get(f"{url}/_testbench/info", timeout=10).json()
    assert info["format"] == 1
    assert info["scenarios"] == len(ALL), (
        f"the testbench serves {info['scenarios']} scenarios and the file has {len(ALL)}: "
        "rebuild it or pass --scenarios"
    )
    try:
        yield Bench(url=url, refused_url=info["refused_url"].rstrip("/"))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


# -- the SDK from a scenario ---------------------------------------------------------------------


def effective_policy(scenario: Dict[str, Any]) -> RetryPolicy:
    """The SDK's defaults, overridden by the file's policy, then the scenario's, key by key."""
    merged: Dict[str, Any] = {}
    budget: Any = {}
    for layer in (FILE_POLICY, scenario.get("policy") or {}):
        assert set(layer) <= POLICY_FIELDS, set(layer) - POLICY_FIELDS
        for k, v in layer.items():
            if k == "budget":
                if v is None:
                    budget = None
                else:
                    assert set(v) <= BUDGET_FIELDS
                    budget = {**(budget or {}), **v}
            else:
                merged[k] = v
    d = RetryPolicy()
    return RetryPolicy(
        max_attempts=merged.get("max_attempts", d.max_attempts),
        deadline=merged["deadline_ms"] / 1000 if "deadline_ms" in merged else d.deadline,
        attempt_timeout=merged["attempt_timeout_ms"] / 1000 if "attempt_timeout_ms" in merged else d.attempt_timeout,
        backoff=Backoff.full_jitter(
            merged["base_ms"] / 1000 if "base_ms" in merged else d.backoff.base,
            merged["cap_ms"] / 1000 if "cap_ms" in merged else d.backoff.cap,
        ),
        retry_500=merged.get("retry_500", d.retry_500),
        mint_keys=merged.get("mint_keys", d.mint_keys),
        budget=None if budget is None else BudgetConfig(**budget),
    )


@dataclass
class Call:
    index: int
    spec: Dict[str, Any]


def expand(scenario: Dict[str, Any]) -> List[Call]:
    calls: List[Call] = []
    for spec in scenario["calls"]:
        assert set(spec) <= CALL_FIELDS, (scenario["id"], set(spec) - CALL_FIELDS)
        assert set(spec["expect"]) <= EXPECT_FIELDS, set(spec["expect"]) - EXPECT_FIELDS
        assert set(spec["expect"]["result"]) <= RESULT_FIELDS, set(spec["expect"]["result"]) - RESULT_FIELDS
        for _ in range(int(spec.get("repeat", 1))):
            calls.append(Call(len(calls), spec))
    return calls


@dataclass
class Outcome:
    elapsed_ms: float
    status: Optional[int] = None
    headers: Optional[httpx.Headers] = None
    body: Optional[bytes] = None
    error: Optional[oncely.RetryError] = None


@dataclass
class Request:
    method: str
    url: str
    headers: Dict[str, str]
    content: Optional[bytes]
    extensions: Dict[str, Any]
    layers: int
    key_value: Optional[str] = None
    other: Dict[str, Any] = field(default_factory=dict)


def build_request(scenario: Dict[str, Any], run: str, call: Call, bench: Bench) -> Request:
    spec = call.spec
    base = bench.refused_url if scenario.get("target", "testbench") == "refused" else bench.url
    headers = {"x-oncely-scenario": scenario["id"], "x-oncely-run": run, "x-oncely-call": str(call.index)}
    headers.update(spec.get("headers") or {})
    options: Dict[str, Any] = {}
    key = spec.get("key", "auto")
    key_value: Optional[str] = None
    if key == "none":
        options["mint_key"] = False
    elif isinstance(key, dict):
        key_value = str(key["value"])
        # The caller's key: the Idempotency-Key header when it can be written as one (ASCII),
        # else the call option (httpx refuses non-ASCII header values before we could).
        if key_value.isascii():
            headers["Idempotency-Key"] = key_value
        else:
            options["idempotency_key"] = key_value
    else:
        assert key == "auto", key
    if "deadline_ms" in spec:
        options["deadline"] = spec["deadline_ms"] / 1000
    if "max_attempts" in spec:
        options["max_attempts"] = spec["max_attempts"]
    content: Optional[bytes] = None
    body = spec.get("body")
    if body is not None:
        content = body["text"].encode("utf-8")
        headers["content-type"] = body["content_type"]
    return Request(
        method=spec["method"],
        url=base + spec["path"],
        headers=headers,
        content=content,
        extensions={"oncely": CallOptions(**options)} if options else {},
        layers=int(spec.get("layers", 1)),
        key_value=key_value,
    )


def run_sync(scenario: Dict[str, Any], run: str, bench: Bench) -> List[Outcome]:
    policy = effective_policy(scenario)
    base = httpx.HTTPTransport()
    one = oncely.RetryTransport(base, policy)
    two = oncely.RetryTransport(one, policy, budget=one.budget)
    outcomes = []
    with httpx.Client(transport=one, timeout=None) as c1, httpx.Client(transport=two, timeout=None) as c2:
        for call in expand(scenario):
            req = build_request(scenario, run, call, bench)
            client = c2 if req.layers == 2 else c1
            began = time.monotonic()
            try:
                r = client.request(req.method, req.url, headers=req.headers, content=req.content, extensions=req.extensions)
                out = Outcome((time.monotonic() - began) * 1000, r.status_code, r.headers, r.content)
            except oncely.RetryError as e:
                out = Outcome((time.monotonic() - began) * 1000, error=e)
            outcomes.append(out)
    return outcomes


def run_async(scenario: Dict[str, Any], run: str, bench: Bench) -> List[Outcome]:
    async def go() -> List[Outcome]:
        policy = effective_policy(scenario)
        base = httpx.AsyncHTTPTransport()
        one = oncely.AsyncRetryTransport(base, policy)
        two = oncely.AsyncRetryTransport(one, policy, budget=one.budget)
        outcomes = []
        async with httpx.AsyncClient(transport=one, timeout=None) as c1, httpx.AsyncClient(transport=two, timeout=None) as c2:
            for call in expand(scenario):
                req = build_request(scenario, run, call, bench)
                client = c2 if req.layers == 2 else c1
                began = time.monotonic()
                try:
                    r = await client.request(req.method, req.url, headers=req.headers, content=req.content, extensions=req.extensions)
                    out = Outcome((time.monotonic() - began) * 1000, r.status_code, r.headers, r.content)
                except oncely.RetryError as e:
                    out = Outcome((time.monotonic() - began) * 1000, error=e)
                outcomes.append(out)
        return outcomes

    return asyncio.run(go())


def fetch_run(bench: Bench, run: str) -> Dict[str, Any]:
    deadline = time.monotonic() + 2.0
    while True:
        report: Dict[str, Any] = httpx.get(f"{bench.url}/_testbench/runs/{run}", timeout=10).json()
        busy = any(a.get("answer") == "in_progress" for a in report.get("attempts", []))
        if not busy or time.monotonic() > deadline:
            return report
        time.sleep(0.05)


# -- checks ----------------------------------------------------------------------------------


class Failed(AssertionError):
    pass


def check(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise Failed(f"{where}: {message}")


def within(value: float, pair: Any, where: str, what: str) -> None:
    low, high = pair[0], pair[1]
    check(value >= low - LOW_MS, where, f"{what} {value:.1f} ms is below {low} ms")
    if high is not None:
        check(value <= high + SLACK_MS, where, f"{what} {value:.1f} ms is above {high} ms (+{SLACK_MS:.0f} ms slack)")


def bounds(value: float, bound: Dict[str, Any], where: str, what: str) -> None:
    within(value, [bound.get("min", float("-inf")), bound.get("max")], where, what)


def valid_key(key: Optional[str]) -> bool:
    return key is not None and 1 <= len(key) <= 255 and all("!" <= c <= "~" for c in key)


def check_scenario(scenario: Dict[str, Any], run: str, outcomes: List[Outcome], report: Dict[str, Any]) -> None:
    calls = expand(scenario)
    by_call: Dict[int, List[Dict[str, Any]]] = {c.index: [] for c in calls}
    for a in report.get("attempts", []):
        check(a["call"] in by_call, scenario["id"], f"the testbench saw an attempt of unknown call {a['call']}")
        by_call[a["call"]].append(a)
    minted: List[str] = []
    for call, out in zip(calls, outcomes):
        spec, expect = call.spec, call.spec["expect"]
        where = f"{scenario['id']} call {call.index}"
        attempts = sorted(by_call[call.index], key=lambda a: a["attempt"])
        check(len(attempts) == expect["attempts"], where, f"the testbench saw {len(attempts)} attempts, expected {expect['attempts']}")
        key_value = spec["key"]["value"] if isinstance(spec.get("key"), dict) else None
        body = spec.get("body")
        body_bytes = b"" if body is None else body["text"].encode("utf-8")
        for a in attempts:
            w = f"{where} attempt {a['attempt']}"
            names = {n: v for n, v in a["headers"]}
            check(names.get("x-oncely-scenario") == scenario["id"], w, "x-oncely-scenario missing or changed")
            check(names.get("x-oncely-run") == run, w, "x-oncely-run missing or changed")
            check(names.get("x-oncely-call") == str(call.index), w, "x-oncely-call missing or changed")
            check(a["body_len"] == len(body_bytes), w, f"body of {a['body_len']} bytes, expected {len(body_bytes)}")
            check(a["body_sha256"] == hashlib.sha256(body_bytes).hexdigest(), w, "body bytes differ from the call's body")
        keys = [a["idempotency_key"] for a in attempts]
        if expect["key"] == "minted":
            check(all(a["idempotency_key_count"] == 1 for a in attempts), where, f"key counts {[a['idempotency_key_count'] for a in attempts]}")
            check(len(set(keys)) <= 1, where, f"different keys across attempts: {keys}")
            check(all(valid_key(k) for k in keys), where, f"invalid minted key {keys}")
            if keys:
                minted.append(str(keys[0]))
        elif expect["key"] == "given":
            check(all(k == key_value and a["idempotency_key_count"] == 1 for k, a in zip(keys, attempts)), where, f"keys {keys}, expected {key_value!r}")
        else:
            check(all(a["idempotency_key_count"] == 0 for a in attempts), where, f"attempts carried keys {keys}")
        waits = [attempts[i]["arrived_ms"] - attempts[i - 1]["ended_ms"] for i in range(1, len(attempts))]
        if "waits_ms" in expect:
            check(len(expect["waits_ms"]) == len(waits), where, f"{len(waits)} waits, the file lists {len(expect['waits_ms'])}")
            for i, (wait, pair) in enumerate(zip(waits, expect["waits_ms"])):
                within(wait, pair, where, f"wait before attempt {i + 2}")
        if "total_wait_ms" in expect:
            bounds(sum(waits), expect["total_wait_ms"], where, "total wait")
        if "attempt_ms" in expect:
            check(len(expect["attempt_ms"]) == len(attempts), where, "attempt_ms and attempts differ in length")
            # The client's attempt timer starts before the testbench sees the request (the
            # connect and the send): the first attempt's lower bound is checked with the
            # call's time the testbench did not see added (conformance/retry/README.md, "How a
            # runner checks a scenario"); the upper bound with the held time alone.
            unseen = max(out.elapsed_ms - (attempts[-1]["ended_ms"] - attempts[0]["arrived_ms"]), 0.0) if attempts else 0.0
            for n, (a, pair) in enumerate(zip(attempts, expect["attempt_ms"])):
                held = a["ended_ms"] - a["arrived_ms"]
                what = f"attempt {a['attempt']} held ({a['answer']})"
                credit = unseen if n == 0 else 0.0
                check(held + credit >= pair[0] - LOW_MS, where, f"{what} {held:.1f} ms (+{credit:.1f} ms the testbench did not see) is below {pair[0]} ms")
                within(held, [float("-inf"), pair[1]], where, what)
        if "elapsed_ms" in expect:
            bounds(out.elapsed_ms, expect["elapsed_ms"], where, "the call's duration")
        result = expect["result"]
        if "error" in result:
            e = out.error
            check(e is not None, where, f"expected a {result['error']} error, got status {out.status}")
            assert e is not None
            check(e.reason == result["error"], where, f"error {e.reason} ({e}), expected {result['error']}")
            check(e.outcome_unknown == result["outcome_unknown"], where, f"outcome_unknown {e.outcome_unknown}")
            check(e.attempts == result["attempts"], where, f"error says {e.attempts} attempts, expected {result['attempts']}")
            check(e.last_status == result["last_status"], where, f"last_status {e.last_status}, expected {result['last_status']}")
            if result["key"] == "minted":
                expected_key = keys[0] if keys else None
                ok = e.idempotency_key == expected_key if keys else valid_key(e.idempotency_key)
                check(ok, where, f"error key {e.idempotency_key!r}, attempts carried {keys}")
            elif result["key"] == "given":
                check(e.idempotency_key == key_value, where, f"error key {e.idempotency_key!r}, expected {key_value!r}")
            else:
                check(e.idempotency_key is None, where, f"error key {e.idempotency_key!r}, expected none")
            if "retry_after_ms" in result:
                hint = e.retry_after
                check(hint is not None, where, "the error carries no Retry-After hint")
                assert hint is not None
                bounds(hint * 1000, result["retry_after_ms"], where, "the error's Retry-After hint")
        else:
            check(out.error is None, where, f"expected status {result['status']}, got {out.error!r}")
            check(out.status == result["status"], where, f"status {out.status}, expected {result['status']}")
            if "body_json" in result:
                got = json.loads(out.body or b"null")
                check(got == result["body_json"], where, f"body {got!r}, expected {result['body_json']!r}")
            if "body_text" in result:
                check((out.body or b"").decode("utf-8") == result["body_text"], where, f"body {out.body!r}")
            for name, value in (result.get("headers") or {}).items():
                assert out.headers is not None
                check(out.headers.get(name) == value, where, f"header {name}: {out.headers.get(name)!r}, expected {value!r}")
    if scenario.get("distinct_keys"):
        check(len(set(minted)) == len(minted), scenario["id"], f"keys repeat across calls: {minted}")


# -- the tests ---------------------------------------------------------------------------------


def _record(mode: str, ok: bool) -> None:
    RESULTS[mode][0 if ok else 1] += 1


@pytest.mark.parametrize("scenario", OFFLINE, ids=[s["id"] for s in OFFLINE])
def test_offline(scenario: Dict[str, Any]) -> None:
    ok = False
    try:
        if scenario["kind"] == "defaults":
            check_defaults(scenario)
        else:
            check_jitter(scenario)
        ok = True
    finally:
        _record("offline", ok)


def check_defaults(scenario: Dict[str, Any]) -> None:
    p = RetryPolicy()
    b = p.budget
    assert b is not None
    got = {
        "max_attempts": p.max_attempts,
        "deadline_ms": round(p.deadline * 1000),
        "attempt_timeout_ms": round(p.attempt_timeout * 1000),
        "jitter": p.backoff.jitter,
        "base_ms": round(p.backoff.base * 1000),
        "cap_ms": round(p.backoff.cap * 1000),
        "retry_500": p.retry_500,
        "mint_keys": p.mint_keys,
        "budget": {"capacity": b.capacity, "transient_cost": b.transient_cost, "throttle_cost": b.throttle_cost, "success_refund": b.success_refund},
    }
    assert set(scenario["expect"]) == set(got), set(scenario["expect"]) ^ set(got)
    for name, expected in scenario["expect"].items():
        assert got[name] == expected, f"default {name} is {got[name]!r}, the file says {expected!r}"


def check_jitter(scenario: Dict[str, Any]) -> None:
    policy = scenario.get("policy") or {}
    d = Backoff()
    backoff = Backoff.full_jitter(
        policy["base_ms"] / 1000 if "base_ms" in policy else d.base,
        policy["cap_ms"] / 1000 if "cap_ms" in policy else d.cap,
    )
    import random

    rng = random.Random()
    for entry in scenario["retries"]:
        retry, expect = entry["retry"], entry["expect"]
        draws = [backoff.delay(retry, None, rng) * 1000 for _ in range(scenario["draws"])]
        where = f"{scenario['id']} retry {retry}"
        check(all(x >= 0 for x in draws), where, "a negative draw")
        check(max(draws) <= expect["max_ms"] + 0.001, where, f"a draw of {max(draws)} ms above {expect['max_ms']} ms")
        check(min(draws) < expect["some_below_ms"], where, f"no draw below {expect['some_below_ms']} ms (min {min(draws)})")
        check(max(draws) > expect["some_above_ms"], where, f"no draw above {expect['some_above_ms']} ms (max {max(draws)})")
        mean = sum(draws) / len(draws)
        check(expect["mean_ms"]["min"] <= mean <= expect["mean_ms"]["max"], where, f"mean {mean:.1f} ms outside {expect['mean_ms']}")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", HTTP, ids=[s["id"] for s in HTTP])
def test_http(scenario: Dict[str, Any], mode: str, testbench: Bench) -> None:
    ok = False
    try:
        run = f"py-{mode}-{scenario['id'][:80]}-{uuid.uuid4().hex[:12]}"
        outcomes = (run_sync if mode == "sync" else run_async)(scenario, run, testbench)
        report = fetch_run(testbench, run)
        check_scenario(scenario, run, outcomes, report)
        ok = True
    finally:
        _record(mode, ok)
