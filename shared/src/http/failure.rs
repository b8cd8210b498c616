//! The failures every daemon's requests share, mapped to the envelope once. A daemon's own
//! failure enum holds them as one variant, `Common`, next to its own failures (mapped by its
//! `status` and `code`), and [`crate::daemon_failure!`] writes the conversions around it.

use axum::http::StatusCode;

use super::ApiError;
use crate::runs::GroupSpecError;
use crate::watchers::Full;

/// What any daemon request can fail with besides the daemon's own failures.
#[derive(Debug, thiserror::Error)]
pub enum Common {
    /// The database failed (503 when it does not answer, else 500).
    #[cfg(feature = "db")]
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    /// Anything else that went wrong inside the daemon (logged; the client gets a generic
    /// text).
    #[error("{0}")]
    Internal(String),
    /// An envelope from a shared layer (token check, JSON body, query string): passes through.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Too many streams or long-polls.
    #[error(transparent)]
    TooManyStreams(#[from] Full),
    /// A group setting no caller may use.
    #[error("group.{0}")]
    InvalidGroup(#[from] GroupSpecError),
}

impl Common {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            #[cfg(feature = "db")]
            Common::Db(crate::db::DbError::Closed | crate::db::DbError::Timeout(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            #[cfg(feature = "db")]
            Common::Db(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Common::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Common::Api(e) => e.status,
            Common::TooManyStreams(_) => super::TOO_MANY_STREAMS.status(),
            Common::InvalidGroup(_) => super::INVALID_GROUP.status(),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            #[cfg(feature = "db")]
            Common::Db(crate::db::DbError::Closed | crate::db::DbError::Timeout(_)) => {
                super::UNAVAILABLE.code
            }
            #[cfg(feature = "db")]
            Common::Db(_) => super::INTERNAL.code,
            Common::Internal(_) => super::INTERNAL.code,
            Common::Api(e) => &e.body.error,
            Common::TooManyStreams(_) => super::TOO_MANY_STREAMS.code,
            Common::InvalidGroup(_) => super::INVALID_GROUP.code,
        }
    }
}

impl From<Common> for ApiError {
    fn from(c: Common) -> Self {
        match c {
            Common::Api(e) => e,
            // Logged here; the client gets a generic text.
            #[cfg(feature = "db")]
            Common::Db(e) => ApiError::from(e),
            Common::Internal(e) => ApiError::internal(e),
            c => ApiError::new(c.status(), c.code().to_owned(), c.to_string()),
        }
    }
}

/// The conversions of a daemon's failure enum `$t`, which has a `Common(Common)` variant and
/// `status()` and `code()` for its own variants: `$t::internal(e)`, `From` each shared
/// failure (so `?` works on them), into the envelope, and into a response.
#[cfg(feature = "db")]
#[macro_export]
macro_rules! daemon_failure {
    ($t:ident) => {
        impl $t {
            /// An internal failure, from anything that displays (logged; the client gets a
            /// generic text).
            pub fn internal(e: impl ::std::fmt::Display) -> Self {
                $t::Common($crate::http::Common::Internal(e.to_string()))
            }
        }

        impl From<$crate::db::DbError> for $t {
            fn from(e: $crate::db::DbError) -> Self {
                $t::Common(e.into())
            }
        }

        impl From<$crate::http::ApiError> for $t {
            fn from(e: $crate::http::ApiError) -> Self {
                $t::Common(e.into())
            }
        }

        impl From<$crate::watchers::Full> for $t {
            fn from(e: $crate::watchers::Full) -> Self {
                $t::Common(e.into())
            }
        }

        impl From<$crate::runs::GroupSpecError> for $t {
            fn from(e: $crate::runs::GroupSpecError) -> Self {
                $t::Common(e.into())
            }
        }

        impl From<$t> for $crate::http::ApiError {
            fn from(f: $t) -> Self {
                match f {
                    $t::Common(c) => c.into(),
                    f => {
                        $crate::http::ApiError::new(f.status(), f.code().to_owned(), f.to_string())
                    }
                }
            }
        }

        impl ::axum::response::IntoResponse for $t {
            fn into_response(self) -> ::axum::response::Response {
                $crate::http::ApiError::from(self).into_response()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mapping_for_the_shared_failures() {
        let group = GroupSpecError {
            field: "memory".into(),
            reason: "too large".into(),
        };
        let mut cases: Vec<(Common, u16, &str)> = vec![
            (Common::Internal("secret detail".into()), 500, "internal"),
            (
                Common::Api(ApiError::bad_request("invalid_json", "x")),
                400,
                "invalid_json",
            ),
            (Full::Caller(2).into(), 429, "too_many_streams"),
            (group.into(), 400, "invalid_group"),
        ];
        #[cfg(feature = "db")]
        {
            cases.push((crate::db::DbError::Closed.into(), 503, "unavailable"));
        }
        for (c, status, code) in cases {
            assert_eq!((c.status().as_u16(), c.code()), (status, code), "{c}");
            let text = c.to_string();
            let e = ApiError::from(c);
            assert_eq!(
                (e.status.as_u16(), e.body.error.as_ref()),
                (status, code),
                "{text}"
            );
            assert!(
                !e.body.message.contains("secret detail"),
                "internals stay in the log"
            );
        }
    }
}
