//! Validation errors: every bad field of a request, each named by a JSON Pointer, so that a
//! client learns of all of them at once.

use serde::Serialize;
use utoipa::ToSchema;

/// One invalid field: a JSON Pointer into the request body (or query) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            message: message.into(),
        }
    }
}

/// Collects field errors while a request is parsed, so every bad field is reported at once.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldError>);

impl Violations {
    pub fn push(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(pointer, message));
    }

    /// Keeps the value when it parsed, records the error otherwise.
    pub fn check<T>(&mut self, pointer: &str, parsed: Result<T, String>) -> Option<T> {
        match parsed {
            Ok(value) => Some(value),
            Err(message) => {
                self.push(pointer, message);
                None
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn extend(&mut self, other: Violations) {
        self.0.extend(other.0);
    }

    /// `Ok` when nothing was reported.
    pub fn into_result(self) -> Result<(), Violations> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }

    pub fn into_vec(self) -> Vec<FieldError> {
        self.0
    }
}

/// Escapes one reference token of a JSON Pointer (RFC 6901).
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// An upper bound of the values `json` holds (a container, a member or an element each
/// count one), found without parsing it: what parsing it into a tree would allocate grows
/// with this, not with its bytes.
pub fn json_values(json: &[u8]) -> usize {
    let mut values = 1;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in json {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b',' | b'[' | b'{' => values += 1,
                _ => {}
            }
        }
    }
    values
}

/// The JSON Pointer of the first key that an object of `json` repeats, if any. serde_json
/// keeps the last of repeated keys, which would silently drop what the first said.
pub fn repeated_key(json: &[u8]) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;

    /// Walks a value, recording where it is; `found` gets the first repeated key's pointer.
    struct Walk<'a> {
        path: String,
        found: &'a RefCell<Option<String>>,
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while seq
                .next_element_seed(Walk {
                    path: format!("{}/{index}", self.path),
                    found: self.found,
                })?
                .is_some()
            {
                index += 1;
            }
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut keys = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = format!("{}/{}", self.path, escape_pointer_token(&key));
                if !keys.insert(key) && self.found.borrow().is_none() {
                    *self.found.borrow_mut() = Some(path.clone());
                }
                map.next_value_seed(Walk {
                    path,
                    found: self.found,
                })?;
            }
            Ok(())
        }
    }

    let found = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let walked = Walk {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut deserializer);
    // Syntax errors are reported by the parser proper.
    walked.ok()?;
    found.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_found_with_their_pointer() {
        assert_eq!(repeated_key(br#"[{"a": 1, "b": 2}]"#), None);
        assert_eq!(
            repeated_key(br#"[{"a": 1}, {"a": 1, "gpu_count": 1, "gpu_count": 8}]"#),
            Some("/1/gpu_count".to_owned())
        );
        assert_eq!(
            repeated_key(br#"{"labels": {"team": "x", "team": "y"}}"#),
            Some("/labels/team".to_owned())
        );
        assert_eq!(
            repeated_key(br#"{"n": 1.50, "m": 10000000000000000000000}"#),
            None
        );
    }
}
