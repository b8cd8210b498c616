//! The error codes the daemons answer with, each declared once: its status, its wire code
//! and what it means ([`Code`], declared with [`error_codes!`](crate::error_codes)). A
//! daemon's failure type maps each of its variants to one of them; an operation's document
//! lists the codes it answers by name ([`error_responses!`](crate::error_responses)), and
//! the description of each error status is derived from them: no handler restates an error
//! in prose.

use axum::http::StatusCode;

use super::ApiError;

/// One error code: its HTTP status, its wire name, and its meaning (the text the API
/// documents wherever an operation answers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The HTTP status.
    pub status: u16,
    /// The envelope's `error`.
    pub code: &'static str,
    /// What it means, in a sentence.
    pub doc: &'static str,
}

impl Code {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The envelope with this code and `message`.
    pub fn error(&self, message: impl Into<String>) -> ApiError {
        ApiError::new(self.status(), self.code, message)
    }
}

/// Declares error codes as `Code` constants, each with its status, wire name and meaning
/// (its doc comment, which is also what the API documents):
///
/// ```ignore
/// hako_shared::error_codes! {
///     /// The run is not running (nothing was placed).
///     pub const NOT_LIVE = (409, "not_live");
/// }
/// ```
#[macro_export]
macro_rules! error_codes {
    ($( $(#[doc = $doc:literal])+ $vis:vis const $name:ident = ($status:literal, $code:literal); )*) => {$(
        $(#[doc = $doc])+
        $vis const $name: $crate::http::Code = $crate::http::Code {
            status: $status,
            code: $code,
            doc: concat!($($doc),+),
        };
    )*};
}

/// Declares the error answers of an operation, by code, as a type its `#[utoipa::path]`
/// names in `responses(...)`: one response per status, described by its codes' meanings. A
/// code may carry a note in brackets (the scope an operation needs):
///
/// ```ignore
/// hako_shared::error_responses!(KillErrors { INSUFFICIENT_SCOPE["`runs:kill`"], NO_RUN });
/// ```
#[cfg(feature = "openapi")]
#[macro_export]
macro_rules! error_responses {
    ($name:ident { $($code:path $([$note:literal])?),+ $(,)? }) => {
        #[doc = concat!("The error answers of an operation: ", $(stringify!($code), " "),+)]
        pub(crate) struct $name;
        impl ::utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                ::std::string::String,
                ::utoipa::openapi::RefOr<::utoipa::openapi::response::Response>,
            > {
                $crate::http::error_answers(&[$(
                    (&$code, $crate::error_responses!(@note $($note)?)),
                )+])
            }
        }
    };
    (@note) => { None };
    (@note $note:literal) => { Some($note) };
}

/// The responses of an operation's error codes (with their notes), one per status: what
/// [`error_responses!`](crate::error_responses) builds.
#[cfg(feature = "openapi")]
pub fn error_answers(
    codes: &[(&Code, Option<&str>)],
) -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::response::Response>>
{
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let mut by_status: std::collections::BTreeMap<u16, Vec<String>> = Default::default();
    for (c, note) in codes {
        let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
        by_status.entry(c.status).or_default().push(format!(
            "`{}`{note}: {}",
            c.code,
            c.doc.trim()
        ));
    }
    by_status
        .into_iter()
        .map(|(status, lines)| {
            let r = ResponseBuilder::new()
                .description(lines.join("\n\n"))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build();
            (status.to_string(), r.into())
        })
        .collect()
}

crate::error_codes! {
    /// The body is not the JSON the operation takes (unknown fields too); the message says
    /// where.
    pub const INVALID_JSON = (400, "invalid_json");
    /// A field that is not acceptable; the message names it.
    pub const INVALID_REQUEST = (400, "invalid_request");
    /// The query string is not what the operation takes; the message names the parameter.
    pub const INVALID_QUERY = (400, "invalid_query");
    /// A group setting that is not acceptable; the message names the field.
    pub const INVALID_GROUP = (400, "invalid_group");
    /// The token lacks the scope the operation needs (named beside the code).
    pub const INSUFFICIENT_SCOPE = (403, "insufficient_scope");
    /// A folder-bound token asked for a folder (or a chat) outside its folders, or for what
    /// only an unbound token may see.
    pub const FOLDER_FORBIDDEN = (403, "folder_forbidden");
    /// Group settings beyond a folder-bound caller's authority (it may only tighten the
    /// install's limits); the message names them.
    pub const FORBIDDEN_GROUP_SETTING = (403, "forbidden_group_setting");
    /// No such thing, or not the caller's: the same answer, on purpose.
    pub const NOT_FOUND = (404, "not_found");
    /// The body is larger than the operation takes.
    pub const BODY_TOO_LARGE = (413, "body_too_large");
    /// Not a media file's name (one path segment of plain characters).
    pub const INVALID_MEDIA_NAME = (400, "invalid_media_name");
    /// The folder's media directory would pass runed's `RUNED_MEDIA_FOLDER_MAX`, or holds
    /// more than 10,000 entries.
    pub const MEDIA_FULL = (413, "media_full");
    /// The caller holds as many streams and long-polls open as it may.
    pub const TOO_MANY_STREAMS = (429, "too_many_streams");
    /// Something went wrong inside the daemon (logged there; the message is generic).
    pub const INTERNAL = (500, "internal");
    /// The daemon's database does not answer; try again.
    pub const UNAVAILABLE = (503, "unavailable");
    /// A dependency of the daemon does not answer; the message names it.
    pub const NOT_READY = (503, "not_ready");
}

#[cfg(all(test, feature = "openapi"))]
mod tests {
    use super::*;

    #[test]
    fn an_operations_codes_are_one_response_per_status_with_each_meaning() {
        let r = error_answers(&[
            (&INVALID_JSON, None),
            (&INSUFFICIENT_SCOPE, Some("`runs:read`")),
            (&INVALID_QUERY, None),
        ]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["400", "403"]
        );
        assert_eq!(
            v["400"]["description"],
            "`invalid_json`: The body is not the JSON the operation takes (unknown fields too); \
             the message says where.\n\n`invalid_query`: The query string is not what the \
             operation takes; the message names the parameter."
        );
        assert!(
            v["403"]["description"]
                .as_str()
                .unwrap()
                .starts_with("`insufficient_scope` (`runs:read`): The token lacks")
        );
        assert_eq!(
            v["403"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
    }

    #[test]
    fn a_code_makes_its_envelope() {
        let e = NOT_FOUND.error("no run x");
        assert_eq!(
            (
                e.status.as_u16(),
                e.body.error.as_ref(),
                e.body.message.as_str()
            ),
            (404, "not_found", "no run x")
        );
    }
}
