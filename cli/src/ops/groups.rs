//! `hako groups`: routd's groups.

use anyhow::Context as _;
use hako_client::routd;
use hako_shared::chat::GroupConfig;
use hako_shared::runs::{LlmSpec, Trust};
use serde_json::{Value, json};

use super::{OpsArgs, emit, print_json};

/// `hako groups …`.
#[derive(Debug, clap::Args)]
pub struct GroupsArgs {
    #[command(subcommand)]
    pub command: GroupsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with groups (routd).
#[derive(Debug, clap::Subcommand)]
pub enum GroupsCommand {
    /// Every group.
    List,
    /// One group's settings.
    Show {
        /// The folder.
        folder: String,
    },
    /// Create or replace a group; settings from a JSON file (the body of
    /// `PUT /v1/groups/{folder}`), flags on top. routd checks them and names what is wrong.
    #[command(
        after_help = "Examples:\n  hako groups set team/dev --name 'Dev team'\n  \
        hako groups set team/dev --file team-dev.json\n  \
        hako groups set team/dev --model claude-sonnet-4-5 --daily-tokens 500000\n\n\
        The file: {\"name\", \"system_prompt\", \"grants\": [..], \"group\": {\"network\", \"llm\", ...}}"
    )]
    Set {
        /// The folder.
        folder: String,
        /// The settings file (JSON).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// Its name.
        #[arg(long)]
        name: Option<String>,
        /// Its system prompt.
        #[arg(long)]
        prompt: Option<String>,
        /// The model its agent calls through routd's gateway.
        #[arg(long)]
        model: Option<String>,
        /// The model's wire format (anthropic, openai).
        #[arg(long)]
        api: Option<String>,
        /// Tokens per UTC day.
        #[arg(long)]
        daily_tokens: Option<u64>,
    },
    /// Remove a group (its folder's files stay).
    Rm {
        /// The folder.
        folder: String,
    },
}

/// `hako groups`.
pub async fn groups(args: GroupsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        GroupsCommand::List => {
            let list = d.call(routd::groups(), &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!("{:<24} {:<24} {:<10} sessions", "folder", "name", "trust");
            for g in &list.groups {
                let trust = match g.group.trust {
                    Trust::Untrusted => "untrusted",
                    Trust::Main => "main",
                };
                println!(
                    "{:<24} {:<24} {:<10} {}",
                    g.folder.as_str(),
                    g.name,
                    trust,
                    g.sessions.len()
                );
            }
        }
        GroupsCommand::Show { folder } => {
            let g = d.call(routd::group(&folder), &token).await?;
            emit(json, &g, |g| {
                println!("{}", serde_json::to_string_pretty(g).unwrap_or_default());
                if !g.values_in_box.is_empty() {
                    println!(
                        "note: env_allowlist hands these values to the box as they are: {}; \
                         a secret among them is better lent as a brokered secret (hako secrets)",
                        g.values_in_box.join(", ")
                    );
                }
            });
        }
        GroupsCommand::Set {
            folder,
            file,
            name,
            prompt,
            model,
            api,
            daily_tokens,
        } => {
            let cfg = group_config(
                &folder,
                file.as_deref(),
                SetFlags {
                    name,
                    prompt,
                    model,
                    api,
                    daily_tokens,
                },
            )?;
            let g = d.call(routd::put_group(&folder, &cfg), &token).await?;
            emit(json, &g, |g| println!("group {} set", g.folder));
        }
        GroupsCommand::Rm { folder } => {
            d.call(routd::delete_group(&folder), &token).await?;
            let removed = json!({"folder": folder, "removed": true});
            emit(json, &removed, |_| println!("group {folder} removed"));
        }
    }
    Ok(true)
}

/// The flags of `hako groups set`, over its settings file.
struct SetFlags {
    name: Option<String>,
    prompt: Option<String>,
    model: Option<String>,
    api: Option<String>,
    daily_tokens: Option<u64>,
}

/// The group's settings: `file` (a JSON object, its name defaulting to the folder) with the
/// flags over it. Read here as routd reads it, so a wrong field is named before any call.
fn group_config(
    folder: &str,
    file: Option<&std::path::Path>,
    flags: SetFlags,
) -> anyhow::Result<GroupConfig> {
    let mut body = match file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            serde_json::from_str::<Value>(&text)
                .with_context(|| format!("{} is not JSON", f.display()))?
        }
        None => json!({}),
    };
    let Some(obj) = body.as_object_mut() else {
        anyhow::bail!("the settings file must hold a JSON object");
    };
    obj.entry("name").or_insert_with(|| json!(folder));
    let what = file.map_or_else(|| "the flags".to_owned(), |f| f.display().to_string());
    let mut cfg: GroupConfig =
        serde_json::from_value(body).with_context(|| format!("{what}: not a group's settings"))?;
    if let Some(n) = flags.name {
        cfg.name = n;
    }
    if let Some(p) = flags.prompt {
        cfg.system_prompt = p;
    }
    let api = flags
        .api
        .map(|a| {
            serde_json::from_value(json!(a))
                .map_err(|_| anyhow::anyhow!("--api {a}: anthropic or openai"))
        })
        .transpose()?;
    if flags.model.is_some() || api.is_some() || flags.daily_tokens.is_some() {
        let llm = match (cfg.group.llm.take(), flags.model) {
            (Some(mut l), m) => {
                if let Some(m) = m {
                    l.model = m;
                }
                l
            }
            (None, Some(model)) => LlmSpec {
                model,
                api: Default::default(),
                daily_tokens: None,
            },
            (None, None) => anyhow::bail!(
                "--api and --daily-tokens set the group's model: name it with --model"
            ),
        };
        cfg.group.llm = Some(LlmSpec {
            api: api.unwrap_or(llm.api),
            daily_tokens: flags.daily_tokens.or(llm.daily_tokens),
            ..llm
        });
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_settings_are_read_as_routd_reads_them() {
        use super::{SetFlags, group_config};
        let none = || SetFlags {
            name: None,
            prompt: None,
            model: None,
            api: None,
            daily_tokens: None,
        };
        let c = group_config("team/dev", None, none()).unwrap();
        assert_eq!(c.name, "team/dev");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("g.json");
        std::fs::write(
            &f,
            r#"{"name": "Dev", "group": {"llm": {"model": "m1", "api": "openai"}}}"#,
        )
        .unwrap();
        let c = group_config(
            "team/dev",
            Some(&f),
            SetFlags {
                daily_tokens: Some(9),
                ..none()
            },
        )
        .unwrap();
        let llm = c.group.llm.unwrap();
        assert_eq!((c.name.as_str(), llm.model.as_str()), ("Dev", "m1"));
        assert_eq!((llm.api.as_str(), llm.daily_tokens), ("openai", Some(9)));
        // A misspelt field is named before any call; so are flags that cannot stand alone.
        std::fs::write(&f, r#"{"grnats": ["*"]}"#).unwrap();
        let e = group_config("x", Some(&f), none()).unwrap_err();
        assert!(format!("{e:#}").contains("grnats"), "{e:#}");
        let e = group_config(
            "x",
            None,
            SetFlags {
                api: Some("openai".into()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("--model"), "{e}");
        let e = group_config(
            "x",
            None,
            SetFlags {
                api: Some("gopher".into()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("anthropic or openai"), "{e}");
        std::fs::write(&f, "[1]").unwrap();
        assert!(group_config("x", Some(&f), none()).is_err());
    }
}
