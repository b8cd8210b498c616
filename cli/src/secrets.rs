//! `hako secrets`: the operator's brokered secrets (`specs/egress.md`, Secrets). A value is
//! read from stdin or a file, never from an argument (which `ps` and the shell's history
//! would show), sent to runed once, and never printed; `list` shows names, when each was set,
//! and which groups lend it to which hosts (routd's groups).

use std::io::{IsTerminal as _, Read as _};
use std::process::ExitCode;

use anyhow::Context as _;
use hako_client::{routd, runed};
use hako_shared::secrets::{SecretName, SecretValueRequest};
use serde_json::{Value, json};

use crate::ops::OpsArgs;

/// `hako secrets …`.
#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    #[command(subcommand)]
    pub command: SecretsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with brokered secrets.
#[derive(Debug, clap::Subcommand)]
pub enum SecretsCommand {
    /// Set a secret: its value from stdin (one trailing newline dropped) or `--file`.
    #[command(after_help = "The value is never an argument. Examples:\n  \
                      printf %s \"$TOKEN\" | hako secrets set GH_TOKEN\n  \
                      hako secrets set GH_TOKEN --file ~/.config/gh-token\n\n\
                      Then lend it to a group for its hosts, in the group's settings:\n  \
                      \"group\": {\"network\": \"allowlist\", \"egress_allowlist\": [\"github.com\", \"api.github.com\"],\n  \
                      \"secrets\": [{\"name\": \"GH_TOKEN\", \"hosts\": [\"github.com\", \"api.github.com\"]}]}")]
    Set {
        /// The name: uppercase letters, digits and `_` (the box's variable of that name holds
        /// the run's placeholder).
        name: String,
        /// Read the value from this file instead of stdin.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
    /// The secrets: names, when set, the groups that use them and for which hosts (never a
    /// value).
    List,
    /// Remove a secret (requests that need it are refused from then on).
    Rm {
        /// The name.
        name: String,
    },
}

/// Reads a value: the file's, or stdin's; one trailing newline (`\n` or `\r\n`) dropped. A
/// terminal on stdin is refused (the value would be echoed on screen as it is typed).
fn read_value(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    let mut raw = Vec::new();
    match file {
        Some(f) => {
            std::fs::File::open(f)
                .with_context(|| format!("cannot read {}", f.display()))?
                .take(hako_shared::secrets::MAX_VALUE as u64 + 2)
                .read_to_end(&mut raw)
                .with_context(|| format!("cannot read {}", f.display()))?;
        }
        None => {
            if std::io::stdin().is_terminal() {
                anyhow::bail!(
                    "the value comes from stdin or --file, never from a terminal or an argument: \
                     `printf %s \"$VALUE\" | hako secrets set NAME` or `--file PATH`"
                );
            }
            std::io::stdin()
                .take(hako_shared::secrets::MAX_VALUE as u64 + 2)
                .read_to_end(&mut raw)
                .context("cannot read stdin")?;
        }
    }
    if raw.ends_with(b"\n") {
        raw.pop();
        if raw.ends_with(b"\r") {
            raw.pop();
        }
    }
    hako_shared::secrets::check_value(&raw).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Printable ASCII, checked just above.
    String::from_utf8(raw).context("the value is not text")
}

/// A bad name or value: said on stderr, exit code 2 (bad arguments), nothing sent.
fn bad(what: impl std::fmt::Display) -> ExitCode {
    eprintln!("hako secrets: {what}");
    ExitCode::from(2)
}

/// `hako secrets`: exit 0 done, 1 a daemon refused or did not answer, 2 a bad name or value.
pub async fn secrets(args: SecretsArgs) -> anyhow::Result<ExitCode> {
    let d = args.ops.daemons()?;
    let json = args.ops.json;
    match args.command {
        SecretsCommand::Set { name, file } => {
            let name = match SecretName::parse(&name) {
                Ok(n) => n,
                Err(e) => return Ok(bad(e)),
            };
            let value = match read_value(file.as_deref()) {
                Ok(v) => v,
                Err(e) => return Ok(bad(format!("{e:#}"))),
            };
            let token = d.operator_token().await?;
            let set = SecretValueRequest { value };
            d.call(runed::put_secret(name.as_str(), &set), &token)
                .await?;
            let done = json!({"name": name, "set": true});
            if json {
                println!("{done}");
            } else {
                println!("secret {name} set");
            }
        }
        SecretsCommand::List => {
            let token = d.operator_token().await?;
            let list = d.call(runed::secrets(), &token).await?;
            // Who uses each, from routd's groups (a routd away leaves the column empty).
            let groups = d.call(routd::groups(), &token).await.ok();
            let uses = |name: &SecretName| -> Vec<Value> {
                groups
                    .iter()
                    .flat_map(|l| &l.groups)
                    .filter_map(|g| {
                        let b = g.group.secrets.iter().find(|b| b.name == *name)?;
                        Some(json!({"folder": g.folder, "hosts": b.hosts}))
                    })
                    .collect()
            };
            let rows: Vec<Value> = list
                .secrets
                .iter()
                .map(|s| json!({"name": s.name, "set_at": s.set_at, "used_by": uses(&s.name)}))
                .collect();
            if json {
                println!("{}", json!({"secrets": rows}));
                return Ok(ExitCode::SUCCESS);
            }
            println!("{:<24} {:<26} used by (folder: hosts)", "name", "set at");
            for r in &rows {
                let used: Vec<String> = r["used_by"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|u| {
                        let hosts: Vec<&str> = u["hosts"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        format!(
                            "{}: {}",
                            u["folder"].as_str().unwrap_or("?"),
                            hosts.join(" ")
                        )
                    })
                    .collect();
                println!(
                    "{:<24} {:<26} {}",
                    r["name"].as_str().unwrap_or("?"),
                    r["set_at"].as_str().unwrap_or("?"),
                    if used.is_empty() {
                        "-".to_owned()
                    } else {
                        used.join(", ")
                    }
                );
            }
            if groups.is_none() {
                eprintln!("hako: routd did not answer: which groups use them is not shown");
            }
        }
        SecretsCommand::Rm { name } => {
            let name = match SecretName::parse(&name) {
                Ok(n) => n,
                Err(e) => return Ok(bad(e)),
            };
            let token = d.operator_token().await?;
            d.call(runed::delete_secret(name.as_str()), &token).await?;
            let done = json!({"name": name, "removed": true});
            if json {
                println!("{done}");
            } else {
                println!("secret {name} removed");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_from_a_file_with_one_newline_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("v");
        std::fs::write(&f, "ghp_abc\n").unwrap();
        assert_eq!(read_value(Some(&f)).unwrap(), "ghp_abc");
        std::fs::write(&f, "ghp_abc\r\n").unwrap();
        assert_eq!(read_value(Some(&f)).unwrap(), "ghp_abc");
        std::fs::write(&f, "two\nlines\n").unwrap();
        let e = read_value(Some(&f)).unwrap_err().to_string();
        assert!(!e.contains("lines"), "{e}");
        std::fs::write(&f, "").unwrap();
        assert!(read_value(Some(&f)).is_err());
    }
}
