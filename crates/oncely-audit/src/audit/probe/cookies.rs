//! Cookie jars: with cookies on, each caller presents the cookies its earlier responses set.

/// One credential's cookies: `(name, value)` pairs in the order they were set.
pub(crate) type Jar = Vec<(String, String)>;

/// Applies one `Set-Cookie` (RFC 6265 section 5.2, simplified: the name and value; a
/// `Max-Age` of zero or less, or an empty value, deletes the cookie; `Domain`, `Path` and
/// `Expires` are ignored, as every request goes to the audited API).
pub(crate) fn store_cookie(jar: &mut Jar, raw: &[u8]) {
    let text = String::from_utf8_lossy(raw);
    let mut parts = text.split(';');
    let Some((name, value)) = parts.next().and_then(|nv| nv.split_once('=')) else {
        return;
    };
    let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
    if name.is_empty() {
        return;
    }
    let deleted = value.is_empty()
        || parts.any(|a| {
            a.trim().split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("max-age")
                    && v.trim().parse::<i64>().is_ok_and(|n| n <= 0)
            })
        });
    jar.retain(|(n, _)| *n != name);
    if !deleted {
        jar.push((name, value));
    }
}
