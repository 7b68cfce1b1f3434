//! The store URL: where the store connects (one endpoint or a Redis Cluster's seed nodes) and
//! Oncely's own options, parsed before any connection is opened.

use crate::error::InvalidUrl;
use std::time::Duration;

/// Where the store connects, parsed from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// One Redis: the URL as the redis crate takes it (Oncely's options removed).
    Single(String),
    /// A Redis Cluster: one `redis://` or `rediss://` URL per seed node.
    Cluster(Vec<String>),
}

/// Oncely's own query parameters, removed from the URL before the redis crate sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UrlOptions {
    pub(crate) namespace: Option<String>,
    pub(crate) accept_volatile: Option<bool>,
    pub(crate) wait_replicas: Option<u32>,
    pub(crate) wait_timeout: Option<Duration>,
}

fn bool_param(name: &str, v: &str) -> Result<bool, InvalidUrl> {
    match v {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(InvalidUrl(format!("{name}={v:?}: expected true or false"))),
    }
}

/// Splits `url` into the endpoint and Oncely's options.
///
/// Forms: `redis://…` and `rediss://…` (one endpoint, as the redis crate reads it), and
/// `redis+cluster://[user[:password]@]host:port[,host:port…]` (or `rediss+cluster://` for
/// TLS): the seed nodes of a Redis Cluster, credentials shared by every node, no database
/// number (a cluster has only database 0). Oncely's query parameters are `namespace`,
/// `accept_volatile`, `wait_replicas` and `wait_timeout_ms`; any other parameter is passed on
/// to the redis crate.
pub(crate) fn parse(url: &str) -> Result<(Endpoint, UrlOptions), InvalidUrl> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut options = UrlOptions::default();
    let mut rest: Vec<&str> = Vec::new();
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "namespace" => {
                if value.is_empty() {
                    return Err(InvalidUrl(
                        "namespace=\"\": expected a key prefix of at least one character".into(),
                    ));
                }
                options.namespace = Some(value.to_owned());
            }
            "accept_volatile" => options.accept_volatile = Some(bool_param(name, value)?),
            "wait_replicas" => {
                options.wait_replicas = Some(value.parse().map_err(|_| {
                    InvalidUrl(format!(
                        "wait_replicas={value:?}: expected a number of replicas (0 or more)"
                    ))
                })?);
            }
            "wait_timeout_ms" => {
                let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                    InvalidUrl(format!(
                        "wait_timeout_ms={value:?}: expected milliseconds, at least 1"
                    ))
                })?;
                options.wait_timeout = Some(Duration::from_millis(ms));
            }
            _ => rest.push(pair),
        }
    }
    let passthrough = if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    };
    let (scheme, after) = base
        .split_once("://")
        .ok_or_else(|| InvalidUrl(format!("{url:?} has no scheme (expected redis://…)")))?;
    let endpoint = match scheme {
        "redis+cluster" | "rediss+cluster" => {
            let node_scheme = scheme.trim_end_matches("+cluster");
            let (userinfo, hosts) = match after.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, after),
            };
            let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
            if hosts.contains('/') {
                return Err(InvalidUrl(format!(
                    "{scheme}:// takes host:port seeds and no database number (a Redis Cluster has only database 0): {hosts:?}"
                )));
            }
            let seeds: Vec<String> = hosts
                .split(',')
                .map(|h| {
                    if h.is_empty() {
                        return Err(InvalidUrl(format!("empty seed node in {hosts:?}")));
                    }
                    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
                    Ok(format!("{node_scheme}://{auth}{h}{passthrough}"))
                })
                .collect::<Result<_, _>>()?;
            Endpoint::Cluster(seeds)
        }
        "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" => {
            Endpoint::Single(format!("{base}{passthrough}"))
        }
        other => {
            return Err(InvalidUrl(format!(
                "unknown scheme {other}:// (expected redis://, rediss://, redis+cluster:// or rediss+cluster://)"
            )));
        }
    };
    Ok((endpoint, options))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn single_urls_pass_through_without_oncely_options() {
        let (e, o) =
            parse("redis://:pw@h:6379/2?accept_volatile=true&protocol=resp3&namespace=run-1:a")
                .unwrap();
        assert_eq!(
            e,
            Endpoint::Single("redis://:pw@h:6379/2?protocol=resp3".into())
        );
        assert_eq!(o.accept_volatile, Some(true));
        assert_eq!(o.namespace.as_deref(), Some("run-1:a"));
        assert_eq!(o.wait_replicas, None);
        let (e, o) = parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!(e, Endpoint::Single("redis://127.0.0.1:6379".into()));
        assert_eq!(o, UrlOptions::default());
    }

    #[test]
    fn cluster_urls_become_one_seed_per_node() {
        let (e, o) = parse(
            "redis+cluster://u:p@127.0.0.1:7100,127.0.0.1:7101/?wait_replicas=2&wait_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(
            e,
            Endpoint::Cluster(vec![
                "redis://u:p@127.0.0.1:7100".into(),
                "redis://u:p@127.0.0.1:7101".into()
            ])
        );
        assert_eq!(o.wait_replicas, Some(2));
        assert_eq!(o.wait_timeout, Some(Duration::from_millis(250)));
        let (e, _) = parse("rediss+cluster://a:1").unwrap();
        assert_eq!(e, Endpoint::Cluster(vec!["rediss://a:1".into()]));
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redis+cluster://a:1,a:2/3", "no database number"),
            ("redis+cluster://a:1,,a:2", "empty seed"),
            ("redis://a?wait_replicas=-1", "wait_replicas"),
            ("redis://a?wait_timeout_ms=0", "wait_timeout_ms"),
            ("redis://a?accept_volatile=maybe", "accept_volatile"),
            ("redis://a?namespace=", "namespace"),
            ("http://a", "unknown scheme"),
            ("a:1", "no scheme"),
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
