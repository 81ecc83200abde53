//! Building queries: WHERE clauses whose `$N` placeholders are numbered as values are added,
//! binding those values, mapping unique violations to [`StoreError::Conflict`], and the clock.

use crate::StoreError;

/// A value bound to a dynamically built query, in placeholder order.
pub(super) enum Bind {
    Text(String),
    Int(i64),
}

/// A WHERE clause under construction, numbering `$N` placeholders as values are added.
#[derive(Default)]
pub(super) struct Where {
    clauses: Vec<String>,
    pub binds: Vec<Bind>,
}

impl Where {
    pub fn placeholder(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("${}", self.binds.len())
    }

    pub fn push(&mut self, clause: String) {
        self.clauses.push(clause);
    }

    pub fn sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }
}

pub(super) fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    binds: &'q [Bind],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    for b in binds {
        q = match b {
            Bind::Text(s) => q.bind(s.as_str()),
            Bind::Int(i) => q.bind(*i),
        };
    }
    q
}

pub(super) fn conflict(e: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict { what: what() }
        }
        _ => StoreError::Query(e),
    }
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
