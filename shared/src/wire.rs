//! Enums whose variants have names on the wire and in the database: [`wire_names!`] writes
//! their `ALL`, `as_str`, `parse` and `Display` once, from one table, so that the name of a
//! variant is said in one place (serde's `rename_all` says it again for JSON; the tests of
//! each enum check that the two agree).

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

#[cfg(test)]
mod tests {
    use crate::chat::{Direction, MessageKind, MessageState, TurnState};
    use crate::runs::{LlmApi, Outcome, RunState, SpawnKind};

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
    }
}
