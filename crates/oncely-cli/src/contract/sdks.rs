//! The part of `oncely contract`'s "Retrying" section that shows the schedule from each Oncely
//! SDK (Rust, Python, Node) and, for integrators who write their own loop, the equivalent
//! tenacity configuration in Python. The numbers come from the Rust SDK's default policy, which
//! the Python and Node SDKs match default for default (the conformance suite's `defaults`
//! scenario checks it in each of them).

use super::units::human;
use oncely_client::RetryPolicy;
use std::fmt::Write as _;
use std::time::Duration;

/// Seconds as a Python float literal (`30.0`, `0.5`).
fn py(d: Duration) -> String {
    format!("{:?}", d.as_secs_f64())
}

/// Writes the subsections into `w`.
pub fn write(w: &mut String, sdk: &RetryPolicy) {
    let b = sdk.backoff();
    let _ = writeln!(w, "\n### The same schedule from each Oncely SDK\n");
    let _ = writeln!(
        w,
        "The Rust, Python and Node SDKs ship these defaults and are held to one language-neutral \
         conformance suite (`conformance/retry/`, run in each SDK's CI against the scripted fault \
         server `oncely testbench`): the rules are the same, only the idiom differs (the table in \
         `conformance/retry/README.md`). The whole setup, and a write with an event-derived key:\n"
    );
    let _ = writeln!(
        w,
        "Rust (`crates/oncely-client`, a reqwest middleware):\n\n```rust\n\
         use oncely_client::{{IdempotencyKeyExt, OncelyRetry, RetryPolicy}};\n\n\
         let client = OncelyRetry::new(RetryPolicy::new()).client()?;\n\
         let response = client\n    .post(\"http://127.0.0.1:8080/v1/payments\")\n    \
         .idempotency_key(\"order-confirm-42\")\n    \
         .header(\"content-type\", \"application/json\")\n    \
         .body(r#\"{{\"amount\":1000,\"currency\":\"EUR\"}}\"#)\n    .send()\n    .await?;\n```\n"
    );
    let _ = writeln!(
        w,
        "Python (`sdks/python`, a transport wrapping any httpx transport):\n\n```python\n\
         import httpx, oncely\n\n\
         client = httpx.Client(transport=oncely.RetryTransport())\n\
         response = client.post(\n    \"http://127.0.0.1:8080/v1/payments\",\n    \
         json={{\"amount\": 1000, \"currency\": \"EUR\"}},\n    \
         extensions={{\"oncely\": oncely.CallOptions(idempotency_key=\"order-confirm-42\")}},\n)\n```\n"
    );
    let _ = writeln!(
        w,
        "Node (`sdks/node`, a function with `fetch`'s signature):\n\n```js\n\
         import {{ withRetries }} from 'oncely';\n\n\
         const retrying = withRetries(fetch);\n\
         const response = await retrying('http://127.0.0.1:8080/v1/payments', {{\n  \
         method: 'POST',\n  headers: {{ 'content-type': 'application/json' }},\n  \
         body: JSON.stringify({{ amount: 1000, currency: 'EUR' }}),\n  \
         oncely: {{ idempotencyKey: 'order-confirm-42' }},\n}});\n```\n"
    );
    let _ = writeln!(
        w,
        "| to change | Rust | Python (seconds) | Node (milliseconds) |\n|---|---|---|---|\n\
         | attempts | `RetryPolicy::new().with_max_attempts(4)` | `oncely.RetryPolicy(max_attempts=4)` | `withRetries(fetch, {{ maxAttempts: 4 }})` |\n\
         | overall deadline | `.with_deadline(Duration::from_secs(10))` | `RetryPolicy(deadline=10.0)` | `{{ deadlineMs: 10_000 }}` |\n\
         | per-attempt timeout | `.with_attempt_timeout(Duration::from_secs(2))` | `RetryPolicy(attempt_timeout=2.0)` | `{{ attemptTimeoutMs: 2_000 }}` |\n\
         | backoff base and cap | `.with_full_jitter(Duration::from_millis(200), Duration::from_secs(5))` | `RetryPolicy(backoff=oncely.Backoff.full_jitter(0.2, 5.0))` | `{{ backoff: {{ baseMs: 200, capMs: 5_000 }} }}` |\n\
         | one call's deadline | `CallOptions::new().with_deadline(Duration::from_secs(5))` as a request extension | `extensions={{\"oncely\": {{\"deadline\": 5.0}}}}` | `oncely: {{ deadlineMs: 5_000 }}` in `init` |\n\
         | an outcome-unknown error | `RetryError::from_middleware(&e)`, `.is_outcome_unknown()`, `.idempotency_key()` | `except oncely.OutcomeUnknown as e:` `e.idempotency_key` | `e instanceof OncelyRetryError`, `e.outcomeUnknown`, `e.idempotencyKey` |\n"
    );
    let _ = writeln!(w, "### Your own retry loop: tenacity (Python)\n");
    let _ = writeln!(
        w,
        "Without an Oncely SDK, this [tenacity](https://tenacity.readthedocs.io/) (version 9) \
         configuration around httpx gives the same schedule: the key is fixed once per logical \
         call, outside the loop; at most {} attempts; one deadline of {}, with each attempt's \
         timeout cut to the time left; `wait_random_exponential` is full jitter, `random(0, \
         min(cap, multiplier x 2^(attempt - 1)))`; `Retry-After` (delta-seconds or any of the \
         three HTTP-date forms) is a lower bound; and `stop_before_delay` stops before a sleep \
         that would end past the deadline (a `Retry-After` beyond it ends the call at once).\n",
        sdk.max_attempts(),
        human(sdk.deadline()),
    );
    let _ = writeln!(
        w,
        "```python\nimport email.utils, time, uuid\nfrom datetime import timezone\n\
         from typing import Optional\n\nimport httpx\n\
         from tenacity import (Retrying, retry_if_exception_type, stop_after_attempt,\n                      \
         stop_before_delay, wait_random_exponential)\n\n\n\
         class RetryableResponse(Exception):\n    \
         \"\"\"An answer the schedule retries: 408, 429, 502, 503, 504, 409 idempotency_request_in_flight.\"\"\"\n\n    \
         def __init__(self, response: httpx.Response) -> None:\n        \
         super().__init__(response.status_code)\n        self.response = response\n\n\n\
         def retryable(response: httpx.Response) -> bool:\n    \
         if response.status_code in (408, 429, 502, 503, 504):\n        return True\n    \
         if response.status_code == 409:\n        try:\n            \
         return response.json().get(\"code\") == \"idempotency_request_in_flight\"\n        \
         except ValueError:\n            return False\n    return False\n\n\n\
         def retry_after(response: httpx.Response) -> float:\n    \
         \"\"\"Retry-After in seconds: delta-seconds or any HTTP-date form; 0 if absent or malformed.\"\"\"\n    \
         value = response.headers.get(\"retry-after\", \"\").strip()\n    \
         if value.isdigit():\n        return float(value)\n    try:\n        \
         when = email.utils.parsedate_to_datetime(value)\n    \
         except (TypeError, ValueError):\n        return 0.0\n    \
         if when.tzinfo is None:  # the asctime form carries no zone: it is GMT\n        \
         when = when.replace(tzinfo=timezone.utc)\n    \
         return max(0.0, when.timestamp() - time.time())\n\n\n\
         def pay(client: httpx.Client, url: str, body: dict, key: Optional[str] = None) -> httpx.Response:\n    \
         key = key or str(uuid.uuid4())  # one key per logical call, fixed before the first attempt\n    \
         deadline = time.monotonic() + {deadline}  # one deadline for the whole call, never reset\n    \
         jitter = wait_random_exponential(multiplier={base}, max={cap})  # full jitter\n\n    \
         def wait(state) -> float:  # Retry-After is a lower bound on the jittered wait\n        \
         error = state.outcome.exception()\n        \
         hint = retry_after(error.response) if isinstance(error, RetryableResponse) else 0.0\n        \
         return max(hint, jitter(state))\n\n    \
         for attempt in Retrying(\n        \
         stop=stop_after_attempt({attempts}) | stop_before_delay({deadline}),\n        \
         wait=wait,\n        \
         retry=retry_if_exception_type((RetryableResponse, httpx.TransportError)),\n        \
         reraise=True,\n    ):\n        with attempt:\n            \
         left = max(0.001, min({per_attempt}, deadline - time.monotonic()))  # min(per attempt, time left)\n            \
         response = client.post(url, json=body, headers={{\"Idempotency-Key\": key}},\n                                   \
         timeout=httpx.Timeout(left, connect=min({connect}, left)))\n            \
         if retryable(response):\n                raise RetryableResponse(response)\n            \
         return response\n    raise AssertionError(\"unreachable\")\n```\n",
        deadline = py(sdk.deadline()),
        base = py(b.base()),
        cap = py(b.cap()),
        attempts = sdk.max_attempts(),
        per_attempt = py(sdk.attempt_timeout()),
        connect = py(sdk.connect_timeout()),
    );
    let _ = writeln!(
        w,
        "The caller gets the response, or the last `RetryableResponse` (its `.response`) or \
         `httpx.TransportError` once the schedule gives up; to retry the same operation later, \
         call `pay` again with the same `key`. Retrying every transport error is safe only because \
         every attempt carries the key: do not use this loop for a write without one (a timeout \
         after sending may have run it; the SDKs report that as \"outcome unknown\" instead). What \
         the SDKs add on top: the server's explicit word (problem+json `retryable`, \
         `x-should-retry`, `Stripe-Should-Retry`, in that order), the fleet-wide retry budget, \
         caller keys checked before sending, and typed errors.\n"
    );
}
