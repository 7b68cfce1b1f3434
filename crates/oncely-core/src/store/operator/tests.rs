use super::list::on_route;
use super::*;
use crate::key::{IdempotencyKey, Scope};

#[test]
fn routes_match_the_path_or_below() {
    assert!(on_route("/v1/payments", "/v1/payments"));
    assert!(on_route("/v1/payments/pay_1", "/v1/payments"));
    assert!(on_route("/v1/payments?x=1", "/v1/payments/"));
    assert!(!on_route("/v1/paymentsx", "/v1/payments"));
    assert!(!on_route("/v2/payments", "/v1/payments"));
}

#[test]
fn cursors_round_trip_and_refuse_strangers() {
    let id = RecordKey::new(
        Scope::new("acct \"1\""),
        IdempotencyKey::new("k-1").unwrap(),
    );
    let c = encode_cursor(&id);
    assert_eq!(
        cursor_start(Some(&c)).unwrap(),
        ("acct \"1\"".to_owned(), "k-1".to_owned())
    );
    assert!(matches!(
        cursor_start(Some("zz")),
        Err(OperatorError::BadCursor)
    ));
    assert!(matches!(
        cursor_start(Some(&hex::encode("[1,2]"))),
        Err(OperatorError::BadCursor)
    ));
    assert_eq!(cursor_start(None).unwrap(), (String::new(), String::new()));
}
