//! Cursor pagination shared by every list: `?limit=` (default 100, max 1000) and an opaque
//! `?cursor=` that continues after the last item of the previous page.

use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::error::ApiError;

pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 1000 (default 100).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> Result<i64, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(limit) if (1..=MAX_LIMIT).contains(&limit) => Ok(limit),
            Some(limit) => Err(ApiError::invalid(
                "query:limit",
                format!("limit must be from 1 to {MAX_LIMIT}, got {limit}"),
            )),
        }
    }

    pub fn cursor<T: DeserializeOwned>(&self) -> Result<Option<T>, ApiError> {
        self.cursor.as_deref().map(decode_cursor).transpose()
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` fetched rows: the extra row only says that more
    /// exist, and the cursor points after the last row shown.
    pub fn from_rows<R, C: Serialize>(
        mut rows: Vec<R>,
        limit: i64,
        cursor_of: impl Fn(&R) -> C,
        view: impl Fn(R) -> T,
    ) -> Self {
        let has_more = rows.len() as i64 > limit;
        rows.truncate(limit as usize);
        let next_cursor = if has_more {
            rows.last().map(|row| encode_cursor(&cursor_of(row)))
        } else {
            None
        };
        Page {
            items: rows.into_iter().map(view).collect(),
            next_cursor,
        }
    }
}

pub fn encode_cursor<C: Serialize>(cursor: &C) -> String {
    let json = serde_json::to_vec(cursor).expect("cursors serialise");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

fn decode_cursor<T: DeserializeOwned>(raw: &str) -> Result<T, ApiError> {
    let invalid = || ApiError::invalid("query:cursor", "not a cursor this list returned");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw)
        .map_err(|_| invalid())?;
    // No cursor this service writes holds a NUL character, which PostgreSQL cannot store.
    if bytes.windows(6).any(|w| w == br"\u0000") {
        return Err(invalid());
    }
    serde_json::from_slice(&bytes).map_err(|_| invalid())
}
