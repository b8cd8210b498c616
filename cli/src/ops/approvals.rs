//! `hako approvals`: held tool calls waiting for a person.

use hako_client::routd;
use hako_shared::approvals::ApprovalView;

use super::{OpsArgs, print_json};

/// The most characters of a call's arguments a list line shows; `hako approvals show` prints
/// the whole call.
const LIST_ARGS: usize = 80;

pub(super) fn print_approval(a: &ApprovalView, now: i64) {
    let age = (now - a.requested_at).max(0) / 1000;
    let args = a.arguments.to_string();
    let n = args.chars().count();
    let shown: String = args.chars().take(LIST_ARGS).collect();
    let more = if n > LIST_ARGS {
        format!(
            "… (cut: `hako approvals show {}` prints all {n} characters)",
            a.id
        )
    } else {
        String::new()
    };
    println!(
        "  {:<16} {:<10} {:<14} folder {:<16} chat {:<20} age {age}s  {}{more}",
        a.id,
        a.state.as_str(),
        a.tool,
        a.folder,
        a.chat_jid,
        crate::terminal_safe(&shown),
    );
}

/// `hako approvals …`.
#[derive(Debug, clap::Args)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    pub command: ApprovalsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Held tool calls waiting for a person (routd).
#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// The requests waiting for a verdict, newest first.
    #[command(after_help = "Examples:\n  hako approvals list\n  hako approvals list --all")]
    List {
        /// Also the decided ones.
        #[arg(long)]
        all: bool,
    },
    /// One request whole: every argument of the call, uncut, as it will run.
    #[command(after_help = "Examples:\n  hako approvals show ap-1a2b3c")]
    Show {
        /// The request's id.
        id: String,
    },
    /// Approve a held call: it runs.
    Approve {
        /// The request's id (`ap-…`, from `hako approvals list` or the chat).
        id: String,
    },
    /// Deny a held call: the agent gets an error.
    Deny {
        /// The request's id.
        id: String,
    },
}

/// `hako approvals`: a verdict someone else gave first is an error (exit 1) naming it.
pub async fn approvals(args: ApprovalsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    let (id, approve) = match args.command {
        ApprovalsCommand::List { all } => {
            let list = d.call(routd::approvals().query("all", all), &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
            if list.approvals.is_empty() {
                println!("no approval requests{}", if all { "" } else { " waiting" });
            }
            for a in &list.approvals {
                print_approval(a, now);
            }
            return Ok(true);
        }
        ApprovalsCommand::Show { id } => {
            let a = d.call(routd::approval(&id), &token).await?;
            if json {
                print_json(&a);
                return Ok(true);
            }
            println!("id        {}", a.id);
            println!("state     {}", a.state.as_str());
            println!(
                "call      {}{}",
                a.tool,
                a.target
                    .as_deref()
                    .map(|t| format!(" on {}", crate::terminal_safe(t)))
                    .unwrap_or_default()
            );
            println!("folder    {}", a.folder);
            println!("chat      {}", crate::terminal_safe(&a.chat_jid));
            if let Some(by) = &a.decided_by {
                println!("decided   by {}", crate::terminal_safe(by));
            }
            println!("arguments (whole, as the call runs):");
            let pretty = serde_json::to_string_pretty(&a.arguments)?;
            println!("{}", crate::terminal_safe(&pretty));
            return Ok(true);
        }
        ApprovalsCommand::Approve { id } => (id, true),
        ApprovalsCommand::Deny { id } => (id, false),
    };
    let a = d.call(routd::decide(&id, approve), &token).await?;
    if json {
        print_json(&a);
    } else {
        println!("{id}: {} ({} {})", a.state.as_str(), a.tool, a.folder);
    }
    Ok(true)
}
