//! `NUMERIC` read straight into [`Decimal`].
//!
//! sqlx decodes a `NUMERIC` by first collecting its base-10,000 digits into a list of their
//! own and then adding up powers of 10,000 in `Decimal` arithmetic: an allocation and a few
//! `Decimal` multiplications per value. A month of a thousand reservations' usage is hundreds
//! of thousands of values, so [`Numeric`] reads the wire format directly into `Decimal`'s
//! integer and scale, and leaves to sqlx only what that cannot hold exactly.

use rust_decimal::Decimal;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgHasArrayType, PgTypeInfo, PgValueFormat, PgValueRef, Postgres};
use sqlx::{Decode, Type};

/// A `NUMERIC` as the [`Decimal`] sqlx would decode it, read without the detour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numeric(pub Decimal);

impl Type<Postgres> for Numeric {
    fn type_info() -> PgTypeInfo {
        <Decimal as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <Decimal as Type<Postgres>>::compatible(ty)
    }
}

impl PgHasArrayType for Numeric {
    fn array_type_info() -> PgTypeInfo {
        <Decimal as PgHasArrayType>::array_type_info()
    }
}

impl<'r> Decode<'r, Postgres> for Numeric {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        if value.format() == PgValueFormat::Binary
            && let Some(decimal) = from_binary(value.as_bytes()?)
        {
            return Ok(Numeric(decimal));
        }
        <Decimal as Decode<Postgres>>::decode(value).map(Numeric)
    }
}

const POSITIVE: u16 = 0x0000;
const NEGATIVE: u16 = 0x4000;

/// PostgreSQL's binary `NUMERIC` (four 16-bit words: how many digits, the weight of the first
/// one as a power of 10,000, the sign and the display scale; then the base-10,000 digits) as
/// a `Decimal` of that scale, as sqlx gives it; `None` when it is not a number `Decimal`
/// holds exactly.
fn from_binary(bytes: &[u8]) -> Option<Decimal> {
    let word = |index: usize| {
        let at = 2 * index;
        bytes
            .get(at..at + 2)
            .map(|w| u16::from_be_bytes([w[0], w[1]]))
    };
    let digits = usize::from(word(0)?);
    let weight = i32::from(word(1)?.cast_signed());
    let sign = word(2)?;
    let scale = u32::from(word(3)?);
    if (sign != POSITIVE && sign != NEGATIVE) || scale > 28 || bytes.len() != 8 + 2 * digits {
        return None;
    }
    if digits == 0 {
        return Some(Decimal::ZERO);
    }
    // The mantissa counts units of 10^-scale; digit `i` is worth 10,000^(weight - i).
    let mut mantissa: u128 = 0;
    for index in 0..digits {
        let digit = u128::from(word(4 + index)?);
        let offset = i32::try_from(index).ok()?;
        let exponent = 4 * (weight - offset) + i32::try_from(scale).ok()?;
        let term = match u32::try_from(exponent) {
            Ok(exponent) => digit.checked_mul(10u128.checked_pow(exponent)?)?,
            Err(_) => {
                let divisor = 10u128.checked_pow(exponent.unsigned_abs())?;
                if digit % divisor != 0 {
                    return None;
                }
                digit / divisor
            }
        };
        mantissa = mantissa.checked_add(term)?;
    }
    let mantissa = i128::try_from(mantissa).ok()?;
    let signed = if sign == NEGATIVE {
        -mantissa
    } else {
        mantissa
    };
    Decimal::try_from_i128_with_scale(signed, scale).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// The binary `NUMERIC` of `digits` with `weight`, `sign` and `scale`.
    fn binary(digits: &[u16], weight: i16, sign: u16, scale: u16) -> Vec<u8> {
        let count = u16::try_from(digits.len()).unwrap();
        [count, weight.cast_unsigned(), sign, scale]
            .iter()
            .chain(digits)
            .flat_map(|word| word.to_be_bytes())
            .collect()
    }

    fn decimal(text: &str) -> Decimal {
        Decimal::from_str(text).unwrap()
    }

    #[test]
    fn numbers_read_with_their_display_scale() {
        let cases = [
            (binary(&[1, 4400], 1, POSITIVE, 0), "14400"),
            (binary(&[3600], 0, POSITIVE, 2), "3600.00"),
            (binary(&[12, 3456, 7800], 0, NEGATIVE, 7), "-12.3456780"),
            (binary(&[5000], -1, POSITIVE, 1), "0.5"),
            (
                binary(&[1542, 8571, 4285, 7142, 8571], 0, POSITIVE, 16),
                "1542.8571428571428571",
            ),
            (binary(&[7], -2, POSITIVE, 12), "0.000000070000"),
            (binary(&[1], 2, POSITIVE, 0), "100000000"),
        ];
        for (bytes, expected) in cases {
            let read = from_binary(&bytes).unwrap();
            assert_eq!(read.to_string(), expected);
            assert_eq!(read, decimal(expected));
        }
    }

    #[test]
    fn zero_reads_as_plain_zero_whatever_its_scale() {
        let read = from_binary(&binary(&[], 0, POSITIVE, 20)).unwrap();
        assert_eq!(read.to_string(), "0");
    }

    #[test]
    fn what_decimal_cannot_hold_exactly_is_left_to_sqlx() {
        let nan = binary(&[], 0, 0xC000, 0);
        let too_fine = binary(&[1], -8, POSITIVE, 32);
        let too_large = binary(&[1], 8, POSITIVE, 0);
        let truncated = binary(&[1, 2], 1, POSITIVE, 0)[..10].to_vec();
        for bytes in [nan, too_fine, too_large, truncated] {
            assert_eq!(from_binary(&bytes), None, "{bytes:?}");
        }
    }
}
