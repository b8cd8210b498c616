//! OpenAPI pieces every daemon shares (feature `openapi`): schemas of the wire types whose
//! serde form is a plain string (folders, ids, durations, sizes), the error envelope, and the
//! check that a committed document equals the one the code generates.

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{RefOr, Response, ResponseBuilder};

/// A string schema with a description, an optional pattern and one example.
pub fn string(description: &str, pattern: Option<&str>, example: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .pattern(pattern)
        .examples([example])
        .into()
}

/// An object of string values (secrets, labels).
pub fn string_map(description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String)))
        .into()
}

/// The error envelope as a response with `description`.
pub fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                    "ErrorBody",
                ))))
                .build(),
        )
        .build()
}

/// The generated document as the committed file holds it: pretty JSON and a final newline.
pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    let mut s = doc.to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}

/// What a daemon's API document must hold, checked by [`check_document`].
pub struct Expected<'a> {
    /// `(path, method)`: each documented, with its responses.
    pub routes: &'a [(&'a str, &'a str)],
    /// Schemas that must be real (properties, or variants), not empty.
    pub schemas: &'a [&'a str],
    /// Source folders (below the crate) whose files may not mount a route outside the
    /// document (a bare `.route("`).
    pub sources: &'a [&'a str],
}

/// The one check of a daemon's API document (its test calls it): the committed file is what
/// the code generates ([`check_committed`]), every expected route is in it with responses,
/// every expected schema is real, and no route is mounted outside it.
pub fn check_document(
    doc: &utoipa::openapi::OpenApi,
    crate_dir: &std::path::Path,
    expected: &Expected<'_>,
) -> Result<(), String> {
    check_committed(doc, &crate_dir.join("openapi.json"))?;
    let v = serde_json::to_value(doc).map_err(|e| e.to_string())?;
    for (path, method) in expected.routes {
        let op = &v["paths"][path][method];
        if op["responses"].as_object().is_none_or(|r| r.is_empty()) {
            return Err(format!(
                "{method} {path} is not documented with its responses"
            ));
        }
    }
    let schemas = &v["components"]["schemas"];
    for name in expected.schemas {
        let s = &schemas[name];
        if !(s["properties"].is_object() || s["oneOf"].is_array()) {
            return Err(format!("schema {name} is empty: {s}"));
        }
    }
    for dir in expected.sources {
        let dir = crate_dir.join(dir);
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let p = entry.map_err(|e| e.to_string())?.path();
            if p.extension().is_some_and(|e| e == "rs") {
                let text =
                    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                if text.contains(".route(\"") {
                    return Err(format!("{}: a route outside the document", p.display()));
                }
                // An error answer is documented by its code (`error_responses!`), whose
                // meaning is declared once, never restated in prose.
                if text.contains(concat!("body = ", "ErrorBody")) {
                    return Err(format!(
                        "{}: an error response described in prose; list its codes with hako_shared::error_responses!",
                        p.display()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Compares the generated document with the committed one at `path`. With
/// `HAKO_BLESS=1` in the environment the file is rewritten instead (after an API change);
/// otherwise a difference is an error that says how to update.
pub fn check_committed(
    doc: &utoipa::openapi::OpenApi,
    path: &std::path::Path,
) -> Result<(), String> {
    let generated = render(doc);
    if std::env::var("HAKO_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(path, &generated).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(());
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != generated {
        return Err(format!(
            "{} is not what the code generates; run the test with HAKO_BLESS=1 and commit the file",
            path.display()
        ));
    }
    Ok(())
}
