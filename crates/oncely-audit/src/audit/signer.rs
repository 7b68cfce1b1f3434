//! Standard Webhooks signing: how the audit signs a request as a webhook sender does.

use http::{HeaderName, HeaderValue};

/// A Standard Webhooks signer for `secret` (`whsec_<base64>` or bare base64), `None` when the
/// secret is empty or not base64.
pub(crate) fn signer(secret: &str) -> Option<standardwebhooks::Webhook> {
    if secret.strip_prefix("whsec_").unwrap_or(secret).is_empty() {
        return None;
    }
    standardwebhooks::Webhook::new(secret).ok()
}

/// The `webhook-timestamp` (now, in seconds since the Unix epoch) and `webhook-signature`
/// (`v1,` HMAC-SHA256 over `id.timestamp.payload`) headers for a message `id` whose body is
/// `payload`; empty when the signature cannot be computed. The signature is marked sensitive,
/// so it is never printed.
pub(crate) fn signature_headers(
    signer: &standardwebhooks::Webhook,
    id: &str,
    payload: &[u8],
) -> Vec<(HeaderName, HeaderValue)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    if let Ok(sig) = signer.sign(id, now, payload)
        && let Ok(mut v) = HeaderValue::from_str(&sig)
    {
        v.set_sensitive(true);
        out.push((
            HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP),
            HeaderValue::from(now),
        ));
        out.push((
            HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_SIGNATURE),
            v,
        ));
    }
    out
}
