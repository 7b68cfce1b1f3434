//! Why a document could not be linted.

/// Why a document could not be linted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LintError {
    /// The text is empty or only whitespace.
    #[error("the OpenAPI document is empty")]
    Empty,
    /// The text starts with `{` but is not valid JSON. `line` and `column` are 1-based.
    #[error("the OpenAPI document is not valid JSON (line {line}, column {column}): {message}")]
    Json {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The text is not valid YAML. `line` and `column` are 1-based, 0 when unknown.
    #[error("the OpenAPI document is not valid YAML (line {line}, column {column}): {message}")]
    Yaml {
        /// 1-based line of the error (0 when unknown).
        line: usize,
        /// 1-based column of the error (0 when unknown).
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The document parsed but is not an OpenAPI 3.x or Swagger 2.0 document.
    #[error("not an OpenAPI document: {0}")]
    NotOpenApi(String),
}
