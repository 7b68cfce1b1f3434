//! `oncely serve` over gRPC, as a real process: the Payments service on the REST port, sharing
//! the store and the payment flow with `POST /v1/payments`.

mod common;
use common::start;

use oncely_grpc::payments::v1::payments_client::PaymentsClient;
use oncely_grpc::payments::v1::{CreatePaymentRequest, GetPaymentRequest};
use serde_json::Value;
use tonic::Code;
use tonic_types::StatusExt as _;

fn request<T>(msg: T, account: &str, key: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {account}").parse().unwrap(),
    );
    if let Some(k) = key {
        req.metadata_mut()
            .insert("idempotency-key", k.parse().unwrap());
    }
    req
}

fn pay(amount: i64, source: &str) -> CreatePaymentRequest {
    CreatePaymentRequest {
        amount,
        currency: "eur".into(),
        source: source.into(),
        description: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_rest_share_the_payment_flow_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("grpc.sqlite3");
    let s = start(&["serve", "--store", db.to_str().unwrap()]);
    let mut client = PaymentsClient::connect(s.url.clone()).await.unwrap();

    // Created once, replayed on the retry.
    let first = client
        .create_payment(request(pay(1999, "tok_visa"), "acct_g", Some("g-1")))
        .await
        .unwrap();
    let again = client
        .create_payment(request(pay(1999, "tok_visa"), "acct_g", Some("g-1")))
        .await
        .unwrap();
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    let p = first.into_inner();
    assert_eq!(
        (p.amount, p.currency.as_str(), p.status.as_str()),
        (1999, "EUR", "succeeded")
    );
    assert!(p.charge_id.is_some());

    // The same payment through REST, and a REST payment through gRPC.
    let http = reqwest::Client::new();
    let rest: Value = http
        .get(format!("{}/v1/payments/{}", s.url, p.id))
        .bearer_auth("acct_g")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rest["id"], p.id.as_str());
    assert_eq!(rest["amount"], 1999);
    let made: Value = http
        .post(format!("{}/v1/payments", s.url))
        .bearer_auth("acct_g")
        .header("idempotency-key", "r-1")
        .header("content-type", "application/json")
        .body(r#"{"amount": 500, "currency": "EUR", "source": "tok_visa"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let got = client
        .get_payment(request(
            GetPaymentRequest {
                id: made["id"].as_str().unwrap().into(),
            },
            "acct_g",
            None,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((got.amount, got.status.as_str()), (500, "succeeded"));
    // Another caller does not see it.
    let e = client
        .get_payment(request(
            GetPaymentRequest { id: got.id },
            "acct_other",
            None,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // A decline is a final answer: stored, and replayed with its status and details.
    let declined = |key: &'static str| {
        let mut c = client.clone();
        async move {
            c.create_payment(request(pay(700, "tok_decline"), "acct_g", Some(key)))
                .await
                .unwrap_err()
        }
    };
    let d1 = declined("g-2").await;
    let d2 = declined("g-2").await;
    assert_eq!(d1.code(), Code::FailedPrecondition);
    assert_eq!(
        d1.get_error_details().error_info().unwrap().reason,
        "CARD_DECLINED"
    );
    assert_eq!((d2.code(), d2.message()), (d1.code(), d1.message()));
    assert_eq!(d2.metadata().get("idempotent-replayed").unwrap(), "true");

    // Invalid fields: nothing ran, the key is released, the corrected call succeeds with it.
    let e = client
        .create_payment(request(pay(0, "tok_visa"), "acct_g", Some("g-3")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let violations = e
        .get_error_details()
        .bad_request()
        .unwrap()
        .field_violations
        .clone();
    assert_eq!(violations[0].field, "amount");
    let ok = client
        .create_payment(request(pay(300, "tok_visa"), "acct_g", Some("g-3")))
        .await
        .unwrap();
    assert_eq!(ok.get_ref().amount, 300);

    // The key contract: required, and a reuse with another request is a mismatch.
    let e = client
        .create_payment(request(pay(300, "tok_visa"), "acct_g", None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = client
        .create_payment(request(pay(301, "tok_visa"), "acct_g", Some("g-3")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.get_error_details().error_info().unwrap().reason,
        "IDEMPOTENCY_KEY_MISMATCH"
    );
}
