//! The gRPC section of `oncely contract`: the key in metadata, the status table and the A6
//! retry policy it is made for, all from the live tables of `oncely-grpc`.

use super::units::human;
use oncely_client::RetryPolicy;
use oncely_core::Policy;
use std::fmt::Write as _;
use std::time::Duration;

/// The gRPC section: the key in metadata, the status table and the A6 retry policy it is made
/// for, all from the live tables of `oncely-grpc`.
pub fn write(w: &mut String, policy: &Policy, sdk: &RetryPolicy) {
    use oncely_grpc::status::{ALL_CODES, CallEnd, call_end, code_name, service_config};
    let _ = writeln!(w, "\n## gRPC\n");
    let _ = writeln!(
        w,
        "The same contract over gRPC (the `oncely.payments.v1.Payments` service, \
         `crates/oncely-grpc/proto/oncely/payments/v1/payments.proto`): the key is the \
         `idempotency-key` metadata entry, with the header's rules; `CreatePayment` requires it, \
         `GetPayment` takes none. The fingerprint covers the method path and the message bytes as \
         sent (a retry must send the same bytes: stock clients do). A replay is the stored response \
         verbatim, messages and trailers (`grpc-status`, `grpc-message`, \
         `grpc-status-details-bin`), plus the `idempotent-replayed: true` metadata entry. \
         Client-streaming and bidirectional methods take no key (one sent is refused with \
         `UNIMPLEMENTED`); a server-streaming reply is replayed message for message. The server \
         reads `grpc-timeout`; the lease ({}) does not depend on it, and a handler whose caller's \
         deadline passed still runs to the end and stores its response for the retry.\n",
        human(policy.lease)
    );
    let _ = writeln!(
        w,
        "Every answer of the key machine is a gRPC status whose `grpc-status-details-bin` holds a \
         `google.rpc.ErrorInfo` (domain `{}`, reason the machine code in upper case, metadata \
         `code`, `retryable`, `httpStatus`) and, where HTTP sends `Retry-After`, a \
         `google.rpc.RetryInfo` with the delay ({} by default; the in-flight delay is sized from \
         the first call's progress) and the same delay as gRFC A6 server pushback \
         (`grpc-retry-pushback-ms`).\n",
        oncely_grpc::ERROR_DOMAIN,
        human(Duration::from_secs(policy.retry_after_secs))
    );
    let _ = writeln!(
        w,
        "| machine code | gRPC status | HTTP status (`{}`) | retry with the same key |\n|---|---|---|---|",
        policy.profile.name()
    );
    for row in oncely_grpc::GRPC_STATUS_TABLE {
        let http = policy.profile.status(row.code);
        let _ = writeln!(
            w,
            "| `{}` | `{}`{} | {} | {} |",
            row.code,
            code_name(row.grpc),
            if row.retryable { " + `RetryInfo`" } else { "" },
            http,
            if row.retryable {
                "yes, after the delay"
            } else {
                "never"
            }
        );
    }
    let of = |class: CallEnd| {
        let names: Vec<String> = ALL_CODES
            .into_iter()
            .filter(|c| call_end(*c) == class)
            .map(|c| format!("`{}`", code_name(c)))
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.concat(),
        }
    };
    let _ = writeln!(
        w,
        "\nA handler's own status decides what is kept, every code by its meaning: final answers \
         ({}) are stored and replayed; {} say nothing was done, so they release the key and a \
         retry runs again; failures ({}) are stored from a handler without a transaction (its \
         effects are unknown) and never committed by a transactional one (its step rolls back, \
         the key is released or the request suspended at its last committed step), like a 5xx \
         over HTTP.\n",
        of(CallEnd::Answered),
        of(CallEnd::TryAgain),
        of(CallEnd::Failed)
    );
    let b = sdk.backoff();
    let _ = writeln!(
        w,
        "A stock gRPC client retries safely with this service config (gRFC A6; the backoff is \
         A6's own full jitter, here with the Oncely SDK's attempts and delays):\n\n```json\n{}\n```\n",
        service_config(
            "oncely.payments.v1.Payments",
            sdk.max_attempts(),
            b.base(),
            b.cap()
        )
    );
}
