//! The errors of the canonicalizer, and its nesting limit.

use std::fmt;

/// The deepest nesting of arrays and objects that is canonicalized: 127 levels, the limit of
/// `serde_json`'s parser that fingerprint version 1 was defined with. A deeper body is taken
/// as not JSON ([`JcsErrorKind::TooDeep`]).
pub const MAX_DEPTH: usize = 127;

/// Why a body has no RFC 8785 canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {offset}")]
pub struct JcsError {
    pub(super) kind: JcsErrorKind,
    pub(super) offset: usize,
}

impl JcsError {
    /// What is wrong.
    pub const fn kind(&self) -> JcsErrorKind {
        self.kind
    }

    /// The byte offset in the body where it was found (for a duplicate name, the start of the
    /// object that holds it).
    pub const fn offset(&self) -> usize {
        self.offset
    }
}

/// The kinds of [`JcsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JcsErrorKind {
    /// Not JSON (RFC 8259): a syntax error, bytes that are not UTF-8, or data after the value.
    Syntax,
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Two members of one object have the same name (RFC 7493 section 2.3).
    DuplicateName,
    /// A `\u` escape of a surrogate that is not half of a pair (RFC 7493 section 2.1).
    LoneSurrogate,
    /// A body of 4 GiB (`u32::MAX` bytes) or more.
    TooLarge,
}

impl JcsErrorKind {
    /// Whether the body is JSON (so the error is an I-JSON violation, and the body must be
    /// refused rather than taken as raw bytes). `false` for [`Syntax`](Self::Syntax) and
    /// [`TooDeep`](Self::TooDeep).
    pub const fn is_json(self) -> bool {
        !matches!(self, Self::Syntax | Self::TooDeep)
    }
}

impl fmt::Display for JcsErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Syntax => "not JSON",
            Self::TooDeep => "arrays and objects nested deeper than 127 levels",
            Self::DuplicateName => "an object has two members with the same name",
            Self::LoneSurrogate => "a string escapes a lone UTF-16 surrogate",
            Self::TooLarge => "the body is 4 GiB or more",
        })
    }
}
