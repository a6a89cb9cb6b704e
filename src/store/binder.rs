//! Numbered parameters for statements assembled from parts: each part asks the binder for
//! the placeholder of a value it needs, and the values are bound in the order they were
//! asked for, so no part counts parameters by hand.

use sqlx::Arguments;
use sqlx::postgres::{PgArguments, Postgres};

/// The values of a statement's parameters, bound in the order their placeholders were
/// handed out.
#[derive(Default)]
pub struct Binder {
    arguments: PgArguments,
    count: usize,
    error: Option<sqlx::error::BoxDynError>,
}

impl Binder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `value` as the next parameter and returns its placeholder (`$n`).
    pub fn bind<'q, T>(&mut self, value: T) -> String
    where
        T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        if let Err(error) = self.arguments.add(value)
            && self.error.is_none()
        {
            self.error = Some(error);
        }
        self.count += 1;
        format!("${}", self.count)
    }

    /// The bound values, or the first value that could not be encoded.
    pub fn into_arguments(self) -> Result<PgArguments, sqlx::Error> {
        match self.error {
            Some(error) => Err(sqlx::Error::Encode(error)),
            None => Ok(self.arguments),
        }
    }

    /// A query of `sql` (whose placeholders this binder handed out) returning rows as `O`.
    pub fn query_as<'q, O>(
        self,
        sql: &'q str,
    ) -> Result<sqlx::query::QueryAs<'q, Postgres, O, PgArguments>, sqlx::Error>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        Ok(super::dynamic::query_as_with(sql, self.into_arguments()?))
    }

    /// A query of `sql` (whose placeholders this binder handed out).
    pub fn query<'q>(
        self,
        sql: &'q str,
    ) -> Result<sqlx::query::Query<'q, Postgres, PgArguments>, sqlx::Error> {
        Ok(super::dynamic::query_with(sql, self.into_arguments()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_the_order_they_are_asked_for() {
        let mut binder = Binder::new();
        assert_eq!(binder.bind("vision"), "$1");
        assert_eq!(binder.bind(7_i32), "$2");
        assert_eq!(binder.bind(vec!["a", "b"]), "$3");
        assert!(binder.into_arguments().is_ok());
    }
}
