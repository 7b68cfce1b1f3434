"""The fleet run for the Python SDK (``conformance/README.md``, "The fleet run").

Two modes:

- **client** (``ONCELY_FLEET_URL`` is set: started by ``oncely gates --only fleet
  --client-command ...``): makes ``ONCELY_FLEET_CALLS`` payments one after the other through one
  retrying httpx client configured from the ``ONCELY_FLEET_*`` variables, each with its
  event-derived key ``{ONCELY_FLEET_KEY_PREFIX}-{n}``, and prints one JSON line per call. Clients
  with an even index use :class:`oncely.RetryTransport`, odd ones :class:`oncely.AsyncRetryTransport`,
  so one fleet exercises both.
- **driver** (otherwise): runs ``$ONCELY_BIN gates --only fleet --json --client-command`` with
  this file as the clients (``--clients``, default 20, and ``--calls``, default 10: the Rust fleet
  gate's numbers), prints the gate's summary and exits 0 only when it passed with 0 duplicate
  side effects.

Usage: ``python sdks/python/tests/fleet_client.py [--bin target/debug/oncely] [--clients 20]
[--calls 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import httpx

import oncely
from oncely import Backoff, CallOptions, RetryPolicy

ROOT = Path(__file__).resolve().parents[3]


def policy_from_env() -> RetryPolicy:
    env = os.environ
    return RetryPolicy(
        max_attempts=int(env["ONCELY_FLEET_MAX_ATTEMPTS"]),
        deadline=int(env["ONCELY_FLEET_DEADLINE_MS"]) / 1000,
        attempt_timeout=int(env["ONCELY_FLEET_ATTEMPT_TIMEOUT_MS"]) / 1000,
        backoff=Backoff.full_jitter(
            int(env["ONCELY_FLEET_BASE_MS"]) / 1000, int(env["ONCELY_FLEET_CAP_MS"]) / 1000
        ),
    )


def payment(n: int) -> Dict[str, Any]:
    return {"amount": 100 + n, "currency": "EUR", "source": "tok_visa", "description": "gate"}


def report(key: str, amount: int, status: Optional[int], error: Optional[str], began: float) -> None:
    line = {"key": key, "amount": amount, "status": status, "error": error, "ms": (time.monotonic() - began) * 1000}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def calls() -> List[Tuple[int, str]]:
    prefix = os.environ["ONCELY_FLEET_KEY_PREFIX"]
    return [(n, f"{prefix}-{n}") for n in range(int(os.environ["ONCELY_FLEET_CALLS"]))]


def headers() -> Dict[str, str]:
    return {"authorization": f"Bearer {os.environ['ONCELY_FLEET_ACCOUNT']}"}


def run_sync(url: str) -> oncely.RetryTransport:
    transport = oncely.RetryTransport(policy=policy_from_env())
    with httpx.Client(transport=transport, headers=headers(), timeout=None) as client:
        for n, key in calls():
            began = time.monotonic()
            try:
                r = client.post(
                    f"{url}/v1/payments",
                    json=payment(n),
                    extensions={"oncely": CallOptions(idempotency_key=key)},
                )
                report(key, 100 + n, r.status_code, None, began)
            except oncely.RetryError as e:
                report(key, 100 + n, None, e.reason, began)
    return transport


async def run_async(url: str) -> oncely.AsyncRetryTransport:
    transport = oncely.AsyncRetryTransport(policy=policy_from_env())
    async with httpx.AsyncClient(transport=transport, headers=headers(), timeout=None) as client:
        for n, key in calls():
            began = time.monotonic()
            try:
                r = await client.post(
                    f"{url}/v1/payments",
                    json=payment(n),
                    headers={"Idempotency-Key": key},
                )
                report(key, 100 + n, r.status_code, None, began)
            except oncely.RetryError as e:
                report(key, 100 + n, None, e.reason, began)
    return transport


def client_main() -> int:
    url = os.environ["ONCELY_FLEET_URL"].rstrip("/")
    index = int(os.environ.get("ONCELY_FLEET_CLIENT", "0"))
    if index % 2 == 0:
        transport: Any = run_sync(url)
    else:
        transport = asyncio.run(run_async(url))
    kind = "sync" if index % 2 == 0 else "async"
    print(f"python fleet client {index} ({kind}): {transport.metrics.snapshot()}", file=sys.stderr)
    return 0


def driver_main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=os.environ.get("ONCELY_BIN", str(ROOT / "target" / "debug" / "oncely")))
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))}"
    cmd = [
        args.bin, "gates", "--only", "fleet", "--json",
        "--fleet-clients", str(args.clients), "--fleet-calls", str(args.calls),
        "--client-command", command,
    ]
    print(f"fleet (python): {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    try:
        result = json.loads(done.stdout)
        gate = result["gates"][0]
    except (ValueError, KeyError, IndexError):
        print(f"fleet (python): the gate printed no report (exit {done.returncode}):\n{done.stdout}", file=sys.stderr)
        return 1
    details = gate.get("details", {})
    duplicates = details.get("duplicate_side_effects")
    print(json.dumps({"sdk": "python", **details}))
    passed = bool(gate.get("passed")) and duplicates == 0 and done.returncode == 0
    print(
        f"fleet (python): {details.get('logical_calls')} logical payments, {duplicates} duplicate side "
        f"effects, {details.get('payments')} payments, {details.get('sdk_successes')} finished within the "
        f"SDK's retries, {details.get('unresolved')} unresolved: {'PASS' if passed else 'FAIL'}"
    )
    if not passed:
        print(f"fleet (python): {gate.get('summary')}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    if os.environ.get("ONCELY_FLEET_URL"):
        sys.exit(client_main())
    sys.exit(driver_main(sys.argv[1:]))
