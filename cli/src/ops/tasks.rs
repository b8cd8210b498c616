//! `hako tasks`: scheduled tasks.

use hako_client::routd;

use super::{OpsArgs, emit, or_dash, print_json};

/// `hako tasks …`.
#[derive(Debug, clap::Args)]
pub struct TasksArgs {
    #[command(subcommand)]
    pub command: TasksCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with scheduled tasks (routd).
#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// The active tasks, soonest first.
    #[command(
        after_help = "Examples:\n  hako tasks list\n  hako tasks list --folder team/dev --all"
    )]
    List {
        /// Only this group and the groups below it.
        #[arg(long)]
        folder: Option<String>,
        /// Also the tasks that are done or cancelled.
        #[arg(long)]
        all: bool,
    },
    /// Cancel a task by id.
    Cancel {
        /// The task's id (`hako tasks list`).
        id: String,
    },
}

/// `hako tasks`.
pub async fn tasks(args: TasksArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        TasksCommand::List { folder, all } => {
            let op = routd::tasks().query("all", all).query_opt("folder", folder);
            let list = d.call(op, &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!(
                "{:<22} {:<16} {:<22} {:<10} {:<21} prompt",
                "id", "folder", "chat", "state", "next"
            );
            for t in &list.tasks {
                println!(
                    "{:<22} {:<16} {:<22} {:<10} {:<21} {}",
                    t.id,
                    t.folder,
                    t.chat_jid,
                    t.state,
                    or_dash(t.next_at.as_ref()),
                    t.prompt.chars().take(60).collect::<String>()
                );
            }
        }
        TasksCommand::Cancel { id } => {
            let t = d.call(routd::cancel_task(&id), &token).await?;
            emit(json, &t, |t| println!("task {id}: {}", t.state));
        }
    }
    Ok(true)
}
