//! [`Excerpt`]: a token of the input as an error message quotes it, cut to at most
//! [`EXCERPT_CHARS`] characters.

use std::fmt;

/// The most characters of an input token that an error message quotes
/// ([`Excerpt`]): enough to recognise the token, small enough that a 100 MB line
/// gives a one-line message.
pub const EXCERPT_CHARS: usize = 40;

/// A token of the input as an error quotes it: the whole token when it has at most
/// [`EXCERPT_CHARS`] characters, else its first [`EXCERPT_CHARS`] characters and the
/// token's length in bytes. Only the quoted part is kept (copied from the input).
///
/// Displays as the quoted token (`"alloc"`), or the quoted start, `…` and the length
/// (`"aaaa…" (104857600 bytes)`). Compares equal to a `&str` that is the quoted part
/// of an uncut token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Excerpt {
    head: String,
    token_bytes: usize,
}

impl Excerpt {
    /// Quotes `token`: the whole of it, or its first [`EXCERPT_CHARS`] characters
    /// (cut on a character boundary) and its length.
    pub fn new(token: &str) -> Excerpt {
        let cut = token
            .char_indices()
            .nth(EXCERPT_CHARS)
            .map_or(token.len(), |(i, _)| i);
        Excerpt {
            head: token[..cut].to_string(),
            token_bytes: token.len(),
        }
    }

    /// The quoted part: the whole token, or its first [`EXCERPT_CHARS`] characters.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Length of the whole token, bytes (the input's, not the quoted part's).
    pub fn token_bytes(&self) -> usize {
        self.token_bytes
    }

    /// Whether the token was longer than [`EXCERPT_CHARS`] characters and only its
    /// start is quoted.
    pub fn is_cut(&self) -> bool {
        self.head.len() < self.token_bytes
    }
}

impl From<&str> for Excerpt {
    fn from(token: &str) -> Excerpt {
        Excerpt::new(token)
    }
}

impl From<String> for Excerpt {
    fn from(token: String) -> Excerpt {
        Excerpt::new(&token)
    }
}

impl PartialEq<str> for Excerpt {
    /// Whether the token was not cut and is `other`.
    fn eq(&self, other: &str) -> bool {
        !self.is_cut() && self.head == other
    }
}

impl PartialEq<&str> for Excerpt {
    /// Whether the token was not cut and is `other`.
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl fmt::Display for Excerpt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cut() {
            write!(
                f,
                "\"{}…\" ({} bytes)",
                self.head.escape_debug(),
                self.token_bytes
            )
        } else {
            write!(f, "{:?}", self.head)
        }
    }
}
