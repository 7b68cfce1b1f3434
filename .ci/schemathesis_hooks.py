"""Schemathesis hooks for .ci/schemathesis.sh.

The contract asks a client for a fresh Idempotency-Key per operation (a reused key with another
body is `422 idempotency_key_mismatch` by design). A schema cannot say "unique", so every case
whose generated key is valid gets a fresh valid key here; an invalid generated key (empty, too
long, not visible ASCII) is sent as generated, so invalid keys are still tested.

The webhook receiver (Standard Webhooks) refuses a `webhook-timestamp` more than 5 minutes from
now before it looks at the signature. A schema cannot say "now", so a generated timestamp that is
a number of seconds is replaced by the current time: the delivery then reaches the signature
check, and its generated (unsigned) signature is refused `401 webhook_signature_invalid`, which
is what an unsigned delivery must get. A timestamp that is not a number is sent as generated.
"""

import re
import time
import uuid

import schemathesis
from collections.abc import MutableMapping

VALID_KEY = re.compile(r"^[!-~]{1,255}$")


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    headers = case.headers
    if not isinstance(headers, MutableMapping):
        return None
    for name in list(headers):
        value = headers[name]
        if name.lower() == "idempotency-key" and isinstance(value, str) and VALID_KEY.match(value):
            headers[name] = f"st-{uuid.uuid4().hex}"
        if name.lower() == "webhook-timestamp" and isinstance(value, str) and value.isdigit():
            headers[name] = str(int(time.time()))
    return None
