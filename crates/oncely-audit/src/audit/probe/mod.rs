//! The probe: what one request is ([`request`]), where its key goes ([`placement`]), the bounded
//! client that sends it ([`prober`]), what comes back ([`exchange`]), how both are written as
//! evidence ([`evidence`]), and the two things the client keeps across requests: cookie jars
//! ([`cookies`]) and count-URL readings ([`count`]).
//!
//! Layering: `request` and `cookies` depend on nothing here; `placement` and `evidence` on
//! `request`; `exchange` on `evidence`; `prober` on all of those; `count` on `prober`. The
//! configuration and the webhook signer sit below the probe and never import it.

mod cookies;
mod count;
mod evidence;
mod exchange;
mod placement;
mod prober;
mod request;
#[cfg(test)]
mod tests;

pub(crate) use count::Counted;
pub(crate) use evidence::truncate_body;
pub(crate) use exchange::{Exchange, is_significant};
pub(crate) use placement::KEY_PLACEHOLDER;
pub(crate) use prober::{ProbeError, Prober};
pub(crate) use request::{Cred, Dest, Key, Probe, fresh_value};
