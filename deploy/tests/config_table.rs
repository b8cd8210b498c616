//! README's configuration table and the code name the same environment variables: every
//! variable a daemon's configuration reads is in the table, and every row of the table is
//! read somewhere. A variable added to the code without a row (or a row left behind by a
//! removed one) fails here.

use std::collections::BTreeSet;

/// The files where the daemons read their environment (configuration modules, the verifier,
/// the HTTP bounds, logging, the egress proxy runed starts).
const CONFIG_FILES: &[&str] = &[
    "shared/src/config.rs",
    "shared/src/auth/verifier.rs",
    "shared/src/http/serve.rs",
    "shared/src/telemetry.rs",
    "authd/src/config.rs",
    "runed/src/config.rs",
    "runner/src/config.rs",
    "runner/src/proxy_container.rs",
    "routd/src/config.rs",
    "egress/src/config.rs",
    "telegram/src/config.rs",
];

fn literals(code: &str) -> BTreeSet<String> {
    // Only what ships: the test module at the end of a file reads made-up variables.
    let code = code.split("#[cfg(test)]").next().unwrap_or(code);
    let mut out = BTreeSet::new();
    for (i, part) in code.split('"').enumerate() {
        let looks_like = i % 2 == 1
            && part.contains('_')
            && part.starts_with(|c: char| c.is_ascii_uppercase())
            && part
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        // `AUTHD_JWKS_`, `EGRESS_`: prefixes of families, each member named on its own.
        if looks_like && !part.ends_with('_') {
            out.insert(part.to_owned());
        }
    }
    out
}

#[test]
fn the_readme_table_names_exactly_the_variables_the_daemons_read() {
    let root = hako_deploy::workspace_root();
    let mut code = BTreeSet::new();
    for f in CONFIG_FILES {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        code.extend(literals(&text));
    }
    assert!(
        code.len() > 60,
        "read only {} variables: {code:?}",
        code.len()
    );

    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("## Configuration")
        .nth(1)
        .expect("README has a Configuration section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let table: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();

    let missing: Vec<_> = code.difference(&table).collect();
    let stale: Vec<_> = table.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "read by the code but not in README's configuration table: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in README's configuration table but read by no daemon: {stale:?}"
    );
}

#[test]
fn literals_are_found_outside_tests_only() {
    let code =
        r#"env.get("ROUTD_X"); "not one"; "lower_case"; "PREFIX_"; #[cfg(test)] "TEST_ONLY""#;
    assert_eq!(literals(code), BTreeSet::from(["ROUTD_X".to_owned()]));
}
