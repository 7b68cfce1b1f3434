//! The gates over gRPC: the same guarantees through `oncely serve`'s gRPC Payments service
//! (`oncely.payments.v1.Payments/CreatePayment`, the same port as REST), called with tonic's
//! generated client.
//!
//! | file | gate |
//! |---|---|
//! | [`concurrency`] | N concurrent identical calls with one key -> one payment, one charge, one receipt; every other answer `ABORTED` with `RetryInfo` or the replay |
//! | [`crash`] | SIGKILL after each phase, restart, retry over gRPC -> zero repeated outside calls |

pub mod concurrency;
pub mod crash;

use anyhow::{Result, bail};
use oncely_grpc::payments::v1::payments_client::PaymentsClient;
use oncely_grpc::payments::v1::{CreatePaymentRequest, Payment};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

/// What a gate keeps of one gRPC call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The status (`Ok` for a reply).
    pub code: Code,
    /// The reply.
    pub payment: Option<Payment>,
    /// `idempotent-replayed: true` on the reply.
    pub replayed: bool,
    /// The `ErrorInfo` reason of an error, e.g. `IDEMPOTENCY_REQUEST_IN_FLIGHT`.
    pub reason: Option<String>,
    /// The `RetryInfo` delay of an error.
    pub retry_delay: Option<Duration>,
    /// The message of an error.
    pub message: String,
}

/// A channel to the API server at `url` (`http://HOST:PORT`), connected lazily.
///
/// # Errors
///
/// `url` is not a valid URI.
pub fn channel(url: &str) -> Result<Channel> {
    Ok(Channel::from_shared(url.to_owned())?
        .timeout(Duration::from_secs(30))
        .connect_lazy())
}

/// The gates' payment request: 19.99 EUR (as [`super::http::payment_body`] for REST).
pub fn payment_request(amount: i64) -> CreatePaymentRequest {
    CreatePaymentRequest {
        amount,
        currency: "EUR".into(),
        source: "tok_visa".into(),
        description: Some("gate".into()),
    }
}

/// One `CreatePayment` call as `account` with `key`.
pub async fn create(channel: &Channel, account: &str, key: &str, amount: i64) -> Call {
    let mut req = tonic::Request::new(payment_request(amount));
    let md = req.metadata_mut();
    if let (Ok(auth), Ok(k)) = (format!("Bearer {account}").parse(), key.parse()) {
        md.insert("authorization", auth);
        md.insert("idempotency-key", k);
    }
    match PaymentsClient::new(channel.clone())
        .create_payment(req)
        .await
    {
        Ok(res) => Call {
            code: Code::Ok,
            replayed: res
                .metadata()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true"),
            payment: Some(res.into_inner()),
            reason: None,
            retry_delay: None,
            message: String::new(),
        },
        Err(s) => {
            let d = s.get_error_details();
            Call {
                code: s.code(),
                payment: None,
                replayed: false,
                reason: d.error_info().map(|i| i.reason.clone()),
                retry_delay: d.retry_info().and_then(|r| r.retry_delay),
                message: s.message().to_owned(),
            }
        }
    }
}

/// Retries `CreatePayment` with the same key, as a client with the recommended A6 policy does
/// (retry `ABORTED` and `UNAVAILABLE`, after `RetryInfo`), until a reply or `within` passes;
/// returns it and the number of calls.
///
/// # Errors
///
/// A status that is not retried, or no reply within `within`.
pub async fn until_reply(
    channel: &Channel,
    account: &str,
    key: &str,
    amount: i64,
    within: Duration,
) -> Result<(Call, u32)> {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let c = create(channel, account, key, amount).await;
        match c.code {
            Code::Ok => return Ok((c, tries)),
            Code::Aborted | Code::Unavailable if start.elapsed() < within => {
                tokio::time::sleep(c.retry_delay.unwrap_or(Duration::from_millis(200))).await;
            }
            code => bail!(
                "CreatePayment answered {code:?} ({}) after {tries} call(s)",
                c.message
            ),
        }
    }
}
