//! Text cells that a spreadsheet opens as text, never as a formula (CSV injection).
//!
//! Every CSV the API returns passes its text cells through [`text_cell`]; numbers and times
//! it formats itself are written as they are, so a negative amount stays a number.

use std::borrow::Cow;

/// The first characters that make a spreadsheet read a cell as a formula (or, for tab and
/// carriage return, hide one behind them).
const FORMULA_TRIGGERS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// `text`, with a leading `'` when it would otherwise start a formula.
pub fn text_cell(text: &str) -> Cow<'_, str> {
    if text.starts_with(FORMULA_TRIGGERS) {
        Cow::Owned(format!("'{text}"))
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_openers_are_neutralised() {
        for text in ["=HYPERLINK(\"x\")", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"] {
            assert_eq!(text_cell(text), format!("'{text}"));
        }
    }

    #[test]
    fn other_text_is_left_alone() {
        for text in ["vision", "", "C=4", " =x", "'quoted"] {
            assert!(matches!(text_cell(text), Cow::Borrowed(t) if t == text));
        }
    }
}
