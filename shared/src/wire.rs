//! Enums whose variants have names on the wire and in the database: [`wire_names!`] writes
//! their `ALL`, `as_str`, `parse` and `Display` once, from one table, so that the name of a
//! variant is said in one place (serde's `rename_all` says it again for JSON; the tests of
//! each enum check that the two agree). [`wire_sql!`] stores them by that name: a column
//! reads back as the enum, and a name this build does not know is an error naming the type
//! and the text, never a guess.

/// rusqlite, for [`wire_sql!`] expanded in other crates.
#[cfg(feature = "db")]
#[doc(hidden)]
pub use rusqlite as __rusqlite;

/// Implements `ALL` (every variant, in the table's order), `as_str` (the wire name), `parse`
/// (the inverse; `None` for any other text) and `Display` (the wire name, padded as text is)
/// for a field-less enum, from a table `Variant => "name"`.
///
/// ```
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// enum Light { Red, Green }
/// hako_shared::wire_names!(Light { Red => "red", Green => "green" });
/// assert_eq!(Light::parse("green"), Some(Light::Green));
/// assert_eq!(Light::Red.to_string(), "red");
/// assert_eq!(Light::ALL, [Light::Red, Light::Green]);
/// ```
#[macro_export]
macro_rules! wire_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant, in the order of its table.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }

            /// Parses the wire name.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($name => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

/// Stores enums that have [`wire_names!`] in SQLite by their wire name: `ToSql` writes
/// `as_str`, `FromSql` reads through `parse`, and a name this build does not know (a newer
/// hako's, a hand edit) is a conversion error naming the type and the text:
/// `hako_shared::wire_sql!(Light);` after `wire_names!(Light { … })`.
#[cfg(feature = "db")]
#[macro_export]
macro_rules! wire_sql {
    ($($ty:ident),+ $(,)?) => {$(
        impl $crate::wire::__rusqlite::types::ToSql for $ty {
            fn to_sql(
                &self,
            ) -> $crate::wire::__rusqlite::Result<$crate::wire::__rusqlite::types::ToSqlOutput<'_>>
            {
                Ok(self.as_str().into())
            }
        }

        impl $crate::wire::__rusqlite::types::FromSql for $ty {
            fn column_result(
                v: $crate::wire::__rusqlite::types::ValueRef<'_>,
            ) -> $crate::wire::__rusqlite::types::FromSqlResult<Self> {
                let raw = v.as_str()?;
                $ty::parse(raw).ok_or_else(|| {
                    $crate::wire::__rusqlite::types::FromSqlError::Other(
                        format!("unknown {} {raw:?}", stringify!($ty)).into(),
                    )
                })
            }
        }
    )+};
}

#[cfg(feature = "db")]
mod sql {
    use crate::approvals::ApprovalState;
    use crate::audit::AuditAction;
    use crate::chat::{Direction, MessageKind, MessageState, TurnState};
    use crate::runs::{LlmApi, Outcome, RunState, SpawnKind, SteerState};

    crate::wire_sql!(
        Direction,
        MessageKind,
        MessageState,
        TurnState,
        LlmApi,
        Outcome,
        RunState,
        SpawnKind,
        SteerState,
        ApprovalState,
        AuditAction,
    );
}

#[cfg(test)]
mod tests {
    use crate::approvals::ApprovalState;
    use crate::chat::{Direction, MessageKind, MessageState, TurnState};
    use crate::runs::{LlmApi, Outcome, RunState, SpawnKind, SteerState};

    /// Each name parses back to its variant, and is the one serde writes.
    fn agrees<T>(all: &[T], as_str: fn(T) -> &'static str, parse: fn(&str) -> Option<T>)
    where
        T: Copy + PartialEq + std::fmt::Debug + serde::Serialize,
    {
        for &v in all {
            assert_eq!(parse(as_str(v)), Some(v));
            assert_eq!(
                serde_json::to_value(v).unwrap(),
                serde_json::json!(as_str(v)),
                "{v:?}: serde and the table disagree"
            );
        }
        assert_eq!(parse("no such name"), None);
    }

    #[test]
    fn every_table_agrees_with_serde() {
        agrees(&Direction::ALL, Direction::as_str, Direction::parse);
        agrees(&MessageKind::ALL, MessageKind::as_str, MessageKind::parse);
        agrees(
            &MessageState::ALL,
            MessageState::as_str,
            MessageState::parse,
        );
        agrees(&TurnState::ALL, TurnState::as_str, TurnState::parse);
        agrees(&LlmApi::ALL, LlmApi::as_str, LlmApi::parse);
        agrees(&SpawnKind::ALL, SpawnKind::as_str, SpawnKind::parse);
        agrees(&RunState::ALL, RunState::as_str, RunState::parse);
        agrees(&Outcome::ALL, Outcome::as_str, Outcome::parse);
        agrees(&SteerState::ALL, SteerState::as_str, SteerState::parse);
        agrees(
            &ApprovalState::ALL,
            ApprovalState::as_str,
            ApprovalState::parse,
        );
    }

    /// A stored name reads back as its variant, in every table; a name this build does not
    /// know is an error that names the type and the text.
    #[cfg(feature = "db")]
    #[test]
    fn stored_names_read_back_and_unknown_ones_are_errors() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        for s in TurnState::ALL {
            let got: TurnState = db.query_row("SELECT ?1", [s], |r| r.get(0)).unwrap();
            assert_eq!(got, s);
            let raw: String = db.query_row("SELECT ?1", [s], |r| r.get(0)).unwrap();
            assert_eq!(raw, s.as_str(), "stored by its wire name");
        }
        let got: Option<Outcome> = db.query_row("SELECT NULL", [], |r| r.get(0)).unwrap();
        assert_eq!(got, None);
        let bad = db
            .query_row("SELECT 'paused'", [], |r| r.get::<_, TurnState>(0))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("unknown TurnState \"paused\""), "{bad}");
        let bad = db.query_row("SELECT 7", [], |r| r.get::<_, MessageKind>(0));
        assert!(bad.is_err(), "a number is no name");
    }
}
