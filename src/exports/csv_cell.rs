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

/// `text` as a cell that also reads back exactly: a leading `'` is added where [`text_cell`]
/// adds one and where the text itself starts with `'`, so removing one leading `'` from a
/// cell that has one always gives the text back (what an audit log's CSV needs to be
/// re-hashed from its cells).
pub fn reversible_text_cell(text: &str) -> Cow<'_, str> {
    if text.starts_with('\'') {
        Cow::Owned(format!("'{text}"))
    } else {
        text_cell(text)
    }
}

/// The text a [`reversible_text_cell`] was made from.
pub fn read_reversible_cell(cell: &str) -> &str {
    cell.strip_prefix('\'').unwrap_or(cell)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn reversible_cells_read_back_and_never_open_a_formula(text in "\\PC{0,8}", lead in "[=+\\-@'\t\rab ]{0,2}") {
            let text = format!("{lead}{text}");
            let cell = reversible_text_cell(&text);
            prop_assert_eq!(read_reversible_cell(&cell), text.as_str());
            prop_assert!(!cell.starts_with(FORMULA_TRIGGERS));
        }
    }

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
