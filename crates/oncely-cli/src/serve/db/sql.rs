//! Every statement of the business database, written once in the `$N` dialect of SQLite and
//! PostgreSQL ([`Q`]), and its MySQL form ([`to_mysql`]).

const INSERT_PAYMENT: &str = "INSERT INTO oncely_payments
    (id, scope, idempotency_key, amount, currency, source, description, status, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)
    ON CONFLICT (id) DO NOTHING";
const SELECT_PAYMENT_BY_ID: &str = "SELECT id, amount, currency, source, description, status,
    charge_id, receipt_id, created_at FROM oncely_payments WHERE scope = $1 AND id = $2";
const LIST_PAYMENTS: &str = "SELECT id, amount, currency, source, description, status,
    charge_id, receipt_id, created_at FROM oncely_payments WHERE scope = $1 ORDER BY created_at, id";
const COUNT_PAYMENTS: &str = "SELECT COUNT(*) AS n FROM oncely_payments";
const SET_CHARGE: &str =
    "UPDATE oncely_payments SET charge_id = $1, status = $2 WHERE scope = $3 AND id = $4";
const SET_RECEIPT: &str = "UPDATE oncely_payments SET receipt_id = $1 WHERE scope = $2 AND id = $3";
const INSERT_ORDER: &str =
    "INSERT INTO oncely_orders (id, scope, idempotency_key, items, created_at)
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING";
const LIST_ORDERS: &str =
    "SELECT id, items, created_at FROM oncely_orders WHERE scope = $1 ORDER BY created_at, id";
const INSERT_WEBHOOK_EVENT: &str = "INSERT INTO oncely_webhook_events
    (id, sender, event_id, kind, scope, payment_id, received_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7)";
// A charge.succeeded confirms the charge of a payment still pending (its first attempt died
// between the charge and its phase's commit) and names its charge; a payment already settled
// keeps what its own phases recorded.
const CONFIRM_CHARGE: &str = "UPDATE oncely_payments SET status = 'succeeded',
    charge_id = COALESCE(charge_id, $1) WHERE scope = $2 AND id = $3 AND status IN ('pending', 'succeeded')";
const LIST_WEBHOOK_EVENTS: &str = "SELECT id, sender, event_id, kind, received_at
    FROM oncely_webhook_events WHERE scope = $1 AND payment_id = $2 ORDER BY received_at, id";
const SELECT_ORDER_BY_ID: &str =
    "SELECT id, items, created_at FROM oncely_orders WHERE scope = $1 AND id = $2";

/// A statement of the business database: written once, in the `$N` dialect of SQLite and
/// PostgreSQL ([`Q::standard`]), and rewritten for MySQL and MariaDB ([`Q::mysql`]); a
/// `BusinessDb` gives its own text with `BusinessDb::sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q {
    InsertPayment,
    SelectPaymentById,
    ListPayments,
    CountPayments,
    SetCharge,
    SetReceipt,
    InsertOrder,
    ListOrders,
    InsertWebhookEvent,
    ConfirmCharge,
    ListWebhookEvents,
    SelectOrderById,
}

impl Q {
    /// Every statement, in declaration order (`Q::ALL[q as usize] == q`).
    #[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
    const ALL: [Self; 12] = [
        Self::InsertPayment,
        Self::SelectPaymentById,
        Self::ListPayments,
        Self::CountPayments,
        Self::SetCharge,
        Self::SetReceipt,
        Self::InsertOrder,
        Self::ListOrders,
        Self::InsertWebhookEvent,
        Self::ConfirmCharge,
        Self::ListWebhookEvents,
        Self::SelectOrderById,
    ];

    /// The statement in SQLite's and PostgreSQL's dialect (`$N` parameters, each used once, in
    /// ascending order).
    pub(super) const fn standard(self) -> &'static str {
        match self {
            Self::InsertPayment => INSERT_PAYMENT,
            Self::SelectPaymentById => SELECT_PAYMENT_BY_ID,
            Self::ListPayments => LIST_PAYMENTS,
            Self::CountPayments => COUNT_PAYMENTS,
            Self::SetCharge => SET_CHARGE,
            Self::SetReceipt => SET_RECEIPT,
            Self::InsertOrder => INSERT_ORDER,
            Self::ListOrders => LIST_ORDERS,
            Self::InsertWebhookEvent => INSERT_WEBHOOK_EVENT,
            Self::ConfirmCharge => CONFIRM_CHARGE,
            Self::ListWebhookEvents => LIST_WEBHOOK_EVENTS,
            Self::SelectOrderById => SELECT_ORDER_BY_ID,
        }
    }

    /// The statement in MySQL's dialect ([`to_mysql`] of [`Q::standard`], made once).
    #[cfg(feature = "mysql")]
    pub(super) fn mysql(self) -> &'static str {
        static MYSQL: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| Q::ALL.iter().map(|q| to_mysql(q.standard())).collect());
        &MYSQL[self as usize]
    }
}

/// `sql` in MySQL's dialect: `?` for each `$N` (so the statements must use each parameter
/// once, in ascending order: checked here), and `ON CONFLICT (id) DO NOTHING` as `ON DUPLICATE
/// KEY UPDATE id = id`, which leaves an existing row as it is (not `INSERT IGNORE`, which would
/// also turn a value the database refuses into a warning).
#[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
fn to_mysql(sql: &str) -> String {
    let sql = sql.replace(
        "ON CONFLICT (id) DO NOTHING",
        "ON DUPLICATE KEY UPDATE id = id",
    );
    let mut out = String::with_capacity(sql.len());
    let mut next = 1;
    let mut rest = sql.as_str();
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len() - at - 1, |n| n);
        assert_eq!(
            rest[at + 1..at + 1 + digits].parse::<u32>().ok(),
            Some(next),
            "parameters used once each, in ascending order: {sql}"
        );
        next += 1;
        out.push('?');
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{Q, to_mysql};

    #[test]
    fn every_statement_is_listed_in_order_and_has_a_mysql_form() {
        for (i, q) in Q::ALL.iter().enumerate() {
            assert_eq!(*q as usize, i);
            let mysql = to_mysql(q.standard());
            assert!(
                !mysql.contains('$') && !mysql.contains("ON CONFLICT"),
                "{mysql}"
            );
        }
    }

    #[test]
    fn the_mysql_form_has_question_marks_and_on_duplicate_key() {
        assert_eq!(
            to_mysql("INSERT INTO t (id, a) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"),
            "INSERT INTO t (id, a) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id"
        );
        assert_eq!(
            to_mysql("UPDATE t SET a = $1 WHERE id = $2"),
            "UPDATE t SET a = ? WHERE id = ?"
        );
    }

    #[test]
    #[should_panic(expected = "ascending order")]
    fn parameters_out_of_order_are_refused() {
        to_mysql("UPDATE t SET a = $2 WHERE id = $1");
    }
}
